"""client/boards/doctor.py: each link broken in turn, over the real adb and an emulated board."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rknn_client.boards.doctor import TOOLKIT_LAUNCHER, Check, diagnose, format_report
from rknn_client.deploy.install import launcher_script
from rknn_client.transport.adb import adb_server_running
from rknn_client.transport.security import ENV_TOKEN
from rknn_proto.version import PROTOCOL_VERSION
from tests.adb.conftest import MakeBoard
from tests.adb.fake_daemon import FakeDaemon
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer, free_port
from tests.adb.services import DEFAULT_BOARD_PATHS
from tests.conftest import DaemonFactory


def npu_board(make_board: MakeBoard, **profile: object) -> EmulatedBoard:
    board = make_board(model="Radxa ROCK 5B", **profile)
    node = board.profile.local_path("/dev/rknpu")
    node.parent.mkdir(parents=True)
    node.touch()
    return board


# What the toolkit's `ps -A | grep rknn_server` sees on the emulated board, with and without a daemon.
PS_WITH_DAEMON = 'echo "  PID TTY          TIME CMD"; echo "  4242 ?        00:00:01 rknn_server"'
PS_WITHOUT = 'echo "  PID TTY          TIME CMD"; echo "  4243 ?        00:00:01 sleep"'


@pytest.fixture
def toolkit_ready_board(make_board: MakeBoard) -> Iterator[EmulatedBoard]:
    """An NPU board set up for RKNN-Toolkit2: the daemon named rknn_server in `ps`, the launcher
    deploy installs, and a socket listening at /dev/socket/transfer_proxy."""
    board = npu_board(make_board, commands={"ps": PS_WITH_DAEMON})
    launcher = board.profile.local_path(TOOLKIT_LAUNCHER)
    launcher.parent.mkdir(parents=True)
    launcher.write_text(launcher_script())
    launcher.chmod(0o755)
    path = board.profile.local_path("/dev/socket/transfer_proxy")
    path.parent.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    yield board
    listener.close()


def names(checks: list[Check]) -> list[str]:
    return [check.name for check in checks]


def broken(checks: list[Check]) -> Check:
    """The check the walk stopped at."""
    last = checks[-1]
    assert not last.ok and last.blocking, format_report(checks)
    return last


def test_everything_works(
    adb_env: PrivateAdbServer, toolkit_ready_board: EmulatedBoard, fake_daemon: Callable[[int], FakeDaemon]
) -> None:
    board = toolkit_ready_board
    daemon = fake_daemon(PROTOCOL_VERSION)
    checks = diagnose(board.serial, socket_name=daemon.socket_name)
    assert all(check.ok for check in checks), format_report(checks)
    assert names(checks) == [
        "adb server",
        "adb device",
        "device state",
        "daemon process",
        "abstract socket",
        "toolkit path",
        "gRPC handshake",
        "protocol version",
        "runtime library",
        "NPU device node",
        "NPU driver version",
    ]
    assert "Every link holds." in format_report(checks)
    assert adb_env.adb("forward", "--list").stdout.strip() == ""


def test_a_board_the_toolkit_cannot_reach_is_a_warning_naming_each_missing_piece(
    make_board: MakeBoard, fake_daemon: Callable[[int], FakeDaemon]
) -> None:
    daemon = fake_daemon(PROTOCOL_VERSION)
    # The board's socket table is its own (this machine's may hold a toolkit's @transfer_proxy forward):
    # the daemon's gRPC socket only.
    board = npu_board(
        make_board, commands={"ps": PS_WITHOUT}, board_paths=(*DEFAULT_BOARD_PATHS, "/proc/net/unix")
    )
    table = board.profile.local_path("/proc/net/unix")
    table.parent.mkdir(parents=True)
    table.write_text(
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        f"0000000000000000: 00000002 00000000 00010000 0001 01 4242 @{daemon.socket_name}\n"
    )
    vendor = board.profile.local_path(TOOLKIT_LAUNCHER)
    vendor.parent.mkdir(parents=True)
    shutil.copy(shutil.which("sleep") or "/bin/sleep", vendor)
    checks = diagnose(board.serial, socket_name=daemon.socket_name)
    (toolkit,) = [check for check in checks if check.name == "toolkit path"]
    assert not toolkit.ok and not toolkit.blocking
    assert "no process named rknn_server" in toolkit.detail
    assert "nothing listens on @transfer_proxy or /dev/socket/transfer_proxy" in toolkit.detail
    assert "not a launcher script" in toolkit.detail
    assert "--legacy-listen" in toolkit.fix and "rknn-client deploy" in toolkit.fix
    # A warning: the walk goes on to the daemon itself.
    assert names(checks)[-1] == "NPU driver version"


def test_no_adb_server(adb_env: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    checks = diagnose(None)
    assert names(checks) == ["adb server"]
    assert "start-server" in broken(checks).fix
    assert not adb_server_running("127.0.0.1", port), "doctor must not start an adb server"


def test_no_board_attached(adb_env: PrivateAdbServer) -> None:
    assert broken(diagnose(None)).name == "adb device"


def test_device_offline(adb_env: PrivateAdbServer, make_board: MakeBoard) -> None:
    board = make_board()
    board.go_offline()
    state = adb_env.wait_for_state(board.serial, {"offline", None})
    failed = broken(diagnose(board.serial))
    assert failed.name == ("device state" if state == "offline" else "adb device")
    assert board.serial in failed.detail


def test_daemon_not_running(make_board: MakeBoard) -> None:
    board = npu_board(make_board)
    failed = broken(diagnose(board.serial, socket_name=f"nobody-{uuid.uuid4().hex[:12]}"))
    assert failed.name == "daemon process"
    assert "rknn_server serve" in failed.fix


def test_this_machines_rknn_server_is_not_the_boards(make_board: MakeBoard, tmp_path: Path) -> None:
    """The emulated board's shell sees its own processes only: a vendor-like rknn_server running on
    this machine (another test run's, a developer's) is not on the board."""
    board = npu_board(make_board)
    host_binary = tmp_path / "usr" / "bin" / "rknn_server"
    host_binary.parent.mkdir(parents=True)
    shutil.copy(shutil.which("sleep") or "/bin/sleep", host_binary)
    _, failed = _diagnosed_beside(board, [str(host_binary), "600"], on_board=False)
    assert failed.name == "daemon process"
    assert failed.detail == "no rknn_server daemon runs on the board"


def test_wrong_protocol_version(make_board: MakeBoard, fake_daemon: Callable[[int], FakeDaemon]) -> None:
    board = npu_board(make_board)
    daemon = fake_daemon(999)
    failed = broken(diagnose(board.serial, socket_name=daemon.socket_name))
    assert failed.name == "protocol version"
    assert "999" in failed.detail and "pip install -U" in failed.fix


def test_missing_npu_node(make_board: MakeBoard, fake_daemon: Callable[[int], FakeDaemon]) -> None:
    board = make_board()
    daemon = fake_daemon(PROTOCOL_VERSION)
    assert broken(diagnose(board.serial, socket_name=daemon.socket_name)).name == "NPU device node"


def _diagnosed_beside(
    board: EmulatedBoard, argv: list[str], on_board: bool = True
) -> tuple[subprocess.Popen[bytes], Check]:
    """The first failed check while `argv` runs, on the board or only on this machine, as a process
    that does not serve the daemon's socket."""
    process = subprocess.Popen(argv, env=board.profile.process_env() if on_board else None)
    try:
        return process, broken(diagnose(board.serial, socket_name=f"nobody-{uuid.uuid4().hex[:12]}"))
    finally:
        process.kill()
        process.wait()


def test_vendor_server_and_its_respawn_scripts(make_board: MakeBoard) -> None:
    board = npu_board(make_board)
    bin_dir = board.profile.local_path("/usr/bin/rknn_server").parent
    bin_dir.mkdir(parents=True)
    vendor_binary = bin_dir / "rknn_server"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", vendor_binary)
    (bin_dir / "start_rknn.sh").write_text("#!/bin/sh\nwhile true; do rknn_server; done\n")
    process, failed = _diagnosed_beside(board, [str(vendor_binary), "600"])
    assert failed.name == "daemon process"
    assert f"pid {process.pid}" in failed.detail and "vendor" in failed.detail
    assert "start_rknn.sh" in failed.fix and "killall rknn_server" in failed.fix


def test_vendor_scripts_are_a_warning_when_our_daemon_runs(
    make_board: MakeBoard, fake_daemon: Callable[[int], FakeDaemon]
) -> None:
    board = npu_board(make_board)
    script = board.profile.local_path("/oem/usr/bin/restart_rknn.sh")
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    daemon = fake_daemon(PROTOCOL_VERSION)
    checks = diagnose(board.serial, socket_name=daemon.socket_name)
    warning = next(check for check in checks if check.name == "vendor start scripts")
    assert not warning.ok and not warning.blocking and "restart_rknn.sh" in warning.detail
    assert checks[-1].name == "NPU driver version" and checks[-1].ok
    assert "[WARN] vendor start scripts" in format_report(checks)


def test_tcp_device_skips_adb(fake_daemon: Callable[[int], FakeDaemon]) -> None:
    daemon = fake_daemon(PROTOCOL_VERSION)
    checks = diagnose(f"tcp://127.0.0.1:{daemon.tcp_port}")
    expected = ["tcp connect", "gRPC handshake", "protocol version", "runtime library", "NPU driver version"]
    assert names(checks) == expected
    assert all(check.ok for check in checks), format_report(checks)


def test_tcp_device_not_listening() -> None:
    failed = broken(diagnose(f"tcp://127.0.0.1:{free_port()}"))
    assert failed.name == "tcp connect"
    assert "--listen tcp://" in failed.fix


def test_doctor_uses_the_token_like_every_other_command(
    make_daemon: DaemonFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-doctor-token\n")
    token_file.chmod(0o600)
    daemon = make_daemon("--auth-token-file", str(token_file))
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    refused = broken(diagnose(daemon.url))
    assert refused.name == "gRPC handshake" and "UNAUTHENTICATED" in refused.detail
    assert ENV_TOKEN in refused.fix and "--auth-token-file" in refused.fix
    for checks in (
        diagnose(daemon.url, token="s3cret-doctor-token"),
        with_env_token(monkeypatch, daemon.url),
    ):
        assert all(check.ok or not check.blocking for check in checks), format_report(checks)
        assert names(checks)[-1] == "NPU driver version"


def with_env_token(monkeypatch: pytest.MonkeyPatch, url: str) -> list[Check]:
    monkeypatch.setenv(ENV_TOKEN, "s3cret-doctor-token")
    return diagnose(url)


def test_unreachable_board_fix_names_the_token_file() -> None:
    """A board on the network (192.0.2.1 is TEST-NET-1: nothing answers) needs a non-loopback listener,
    which the daemon serves only with a token; a loopback port gets a loopback daemon instead."""
    failed = broken(diagnose("tcp://192.0.2.1:50515", timeout=0.5))
    assert "--listen tcp://0.0.0.0:50515" in failed.fix and "--auth-token-file" in failed.fix
    port = free_port()
    local = broken(diagnose(f"tcp://127.0.0.1:{port}"))
    assert f"--listen tcp://127.0.0.1:{port}" in local.fix and "0.0.0.0" not in local.fix


def test_python_daemon_is_found_by_its_command_line(make_board: MakeBoard, tmp_path: Path) -> None:
    """The console script runs as `python .../rknn_server serve`: pidof rknn_server misses it."""
    board = npu_board(make_board)
    script = tmp_path / "bin" / "rknn_server"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    script.chmod(0o755)
    process, failed = _diagnosed_beside(board, [sys.executable, str(script), "serve"])
    assert failed.name == "daemon process"
    assert f"pid {process.pid}" in failed.detail and "nothing listens" in failed.detail
