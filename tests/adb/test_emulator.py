"""The emulator against the real adb binary: what tests of the adb transport rely on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from rknn_proto.ready import tcp_address
from tests.adb.conftest import MakeBoard
from tests.adb.fixtures import AbstractEchoServer, PrivateAdbServer

ROOT = Path(__file__).resolve().parents[2]


def read_exactly(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        assert chunk, "forwarded connection closed early"
        data += chunk
    return bytes(data)


def test_devices_lists_the_board_as_device(adb_env: PrivateAdbServer, make_board: MakeBoard) -> None:
    board = make_board(model="Radxa ROCK 5B")
    listing = adb_env.adb("devices", "-l").stdout
    line = next(line for line in listing.splitlines() if line.startswith(board.serial))
    assert line.split()[1] == "device"
    assert "model:Radxa_ROCK_5B" in line


def test_shell_runs_commands_in_the_device_root(adb_env: PrivateAdbServer, make_board: MakeBoard) -> None:
    board = make_board()
    assert adb_env.adb("-s", board.serial, "shell", "echo hi").stdout == "hi\n"
    assert adb_env.adb("-s", board.serial, "shell", "pwd").stdout.strip() == str(board.profile.root)


def test_getprop_and_device_tree_come_from_the_profile(
    adb_env: PrivateAdbServer, make_board: MakeBoard
) -> None:
    board = make_board(model="Orange Pi 5", props={"ro.board.platform": "rk3588"})
    tree = board.profile.local_path("/proc/device-tree")
    tree.mkdir(parents=True)
    (tree / "compatible").write_bytes(b"rockchip,rk3588s-orangepi-5\0rockchip,rk3588\0")
    run = ["-s", board.serial, "shell"]
    assert adb_env.adb(*run, "getprop ro.product.model").stdout.strip() == "Orange Pi 5"
    assert adb_env.adb(*run, "getprop ro.board.platform").stdout.strip() == "rk3588"
    assert "rockchip,rk3588" in adb_env.adb(*run, "cat /proc/device-tree/compatible").stdout


def test_the_shell_sees_the_boards_processes_only(
    adb_env: PrivateAdbServer, make_board: MakeBoard, tmp_path: Path
) -> None:
    """ps, pidof, killall and /proc/PID see what runs on the board, never this machine's other processes."""
    board = make_board()
    binary = tmp_path / "rknn_server"
    binary.write_bytes(Path("/bin/sleep").read_bytes())
    binary.chmod(0o755)
    on_board = subprocess.Popen([str(binary), "600"], env=board.profile.process_env())
    on_host = subprocess.Popen([str(binary), "600"])
    run = ["-s", board.serial, "shell"]
    try:
        listed = [line.split() for line in adb_env.adb(*run, "ps -A").stdout.splitlines()[1:]]
        assert [pid for pid, *_, name in listed if name == "rknn_server"] == [str(on_board.pid)]
        assert adb_env.adb(*run, "pidof rknn_server").stdout.split() == [str(on_board.pid)]
        assert adb_env.adb(*run, "readlink /proc/[0-9]*/exe").stdout.splitlines() == [str(binary)]
        assert "No such file" in adb_env.adb(*run, f"ls /proc/{on_host.pid}/").stdout
        assert adb_env.adb(*run, "killall rknn_server && echo killed").stdout == "killed\n"
        assert on_board.wait(timeout=30) == -15 and on_host.poll() is None
        missing = adb_env.adb(*run, "killall rknn_server; pidof rknn_server || echo none", check=False)
        assert "rknn_server: no process found" in missing.stdout and missing.stdout.endswith("none\n")
    finally:
        for process in (on_board, on_host):
            process.kill()
            process.wait()


def test_push_writes_the_file_under_the_device_root(
    adb_env: PrivateAdbServer, make_board: MakeBoard, tmp_path: Path
) -> None:
    board = make_board()
    payload = os.urandom(3 * 1024 * 1024 + 17)
    source = tmp_path / "model.rknn"
    source.write_bytes(payload)
    adb_env.adb("-s", board.serial, "push", str(source), "/data/local/tmp/model.rknn")
    assert board.profile.local_path("/data/local/tmp/model.rknn").read_bytes() == payload
    listing = adb_env.adb("-s", board.serial, "shell", "ls /data/local/tmp").stdout
    assert listing.split() == ["model.rknn"]


def test_forward_relays_to_a_local_abstract_socket(
    adb_env: PrivateAdbServer, make_board: MakeBoard, echo_server: AbstractEchoServer
) -> None:
    board = make_board()
    port = int(
        adb_env.adb("-s", board.serial, "forward", "tcp:0", f"localabstract:{echo_server.name}").stdout
    )
    payload = os.urandom(4 * 1024 * 1024).hex().encode()
    with socket.create_connection(("127.0.0.1", port)) as connection:
        sender = threading.Thread(target=connection.sendall, args=(payload,))
        sender.start()
        assert read_exactly(connection, len(payload)) == payload.upper()
        sender.join()
    adb_env.adb("-s", board.serial, "forward", "--remove", f"tcp:{port}")


def test_two_boards_at_once(adb_env: PrivateAdbServer, make_board: MakeBoard) -> None:
    first, second = make_board("first"), make_board("second")
    states = {info.serial: info.state for info in adb_env.client().list()}
    assert states[first.serial] == states[second.serial] == "device"
    for board in (first, second):
        answer = adb_env.adb("-s", board.serial, "shell", "getprop ro.product.name").stdout
        assert answer.strip() == board.profile.serial_name


def test_a_stopped_board_is_no_longer_usable(adb_env: PrivateAdbServer, make_board: MakeBoard) -> None:
    board = make_board()
    board.go_offline()
    assert adb_env.wait_for_state(board.serial, {"offline", None}) in {"offline", None}
    assert adb_env.adb("-s", board.serial, "shell", "echo hi", check=False).returncode != 0


def test_subprocess_mode_prints_its_port(adb_env: PrivateAdbServer, tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.adb.emulator",
            "--port",
            "0",
            "--serial-name",
            "sub",
            "--root",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        serial = tcp_address(line)
        assert serial is not None and serial.startswith("127.0.0.1:"), line
        adb_env.adb("connect", serial)
        adb_env.wait_for_state(serial, {"device"})
        assert adb_env.adb("-s", serial, "shell", "getprop ro.product.name").stdout.strip() == "sub"
        adb_env.adb("disconnect", serial)
    finally:
        process.kill()
        process.wait()
