"""`rknn-client devices` and `doctor`, and the toolkit's list_devices, over emulated boards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rknn_client import RKNN, __version__
from rknn_client.cli import main
from rknn_client.transport.security import ENV_TOKEN
from rknn_proto.version import PROTOCOL_VERSION
from tests.adb.conftest import FakeDaemonFactory, MakeBoard
from tests.adb.fixtures import EmulatedBoard
from tests.conftest import DaemonFactory


def with_device_tree(board: EmulatedBoard, compatible: str, model: str) -> EmulatedBoard:
    folder = board.profile.local_path("/proc/device-tree")
    folder.mkdir(parents=True)
    (folder / "compatible").write_bytes(compatible.encode().replace(b" ", b"\0") + b"\0")
    (folder / "model").write_bytes(model.encode() + b"\0")
    return board


def test_devices_table(
    make_board: MakeBoard, fake_daemon: FakeDaemonFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    served = fake_daemon(PROTOCOL_VERSION, soc="rk3588", board="Radxa ROCK 5B")
    with_daemon = make_board("served", abstract_sockets={"rknn_server": served.socket_name})
    bare = with_device_tree(make_board("bare"), "radxa,rock-3a rockchip,rk3568", "Radxa ROCK 3A")
    tcp = fake_daemon(PROTOCOL_VERSION, soc="rk3576", board="RK3576 EVB")
    assert main(["devices", "--device", tcp.url]) == 0
    table = capsys.readouterr().out
    assert table.split()[:3] == ["DEVICE", "TRANSPORT", "STATE"]
    cells = {line.split()[0]: line for line in table.splitlines()[1:]}
    served_row = cells[with_daemon.serial]
    assert "adb-network" in served_row and "rk3588" in served_row and "Radxa ROCK 5B" in served_row
    assert " yes " in served_row and "0.0-fake" in served_row and "rknnrt librknnrt 2.3.2" in served_row
    bare_row = cells[bare.serial]
    assert "rk3568" in bare_row and "Radxa ROCK 3A" in bare_row and " no " in bare_row
    tcp_row = cells[tcp.url]
    assert "tcp" in tcp_row and "rk3576" in tcp_row and " yes " in tcp_row


def test_devices_without_any_board_says_how_to_attach_one(
    adb_env: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["devices"]) == 0
    assert "adb connect" in capsys.readouterr().out


def test_doctor_exit_code(
    make_board: MakeBoard, fake_daemon: FakeDaemonFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = fake_daemon(PROTOCOL_VERSION)
    board = make_board()
    node = board.profile.local_path("/dev/rknpu")
    node.parent.mkdir(parents=True)
    node.touch()
    assert main(["doctor", "--device", board.serial, "--socket", daemon.socket_name]) == 0
    assert "Every link holds." in capsys.readouterr().out
    assert main(["doctor", "--device", board.serial, "--socket", "nobody-listens-here"]) == 1
    assert "[FAIL] daemon process" in capsys.readouterr().out


def test_list_devices_prints_the_toolkit_block(
    make_board: MakeBoard, capsys: pytest.CaptureFixture[str]
) -> None:
    board = make_board()
    rknn = RKNN()
    try:
        assert rknn.list_devices() == ([board.serial], [])
    finally:
        rknn.release()
    assert f"all device(s) with adb mode:\n{board.serial}\n" in capsys.readouterr().out


def test_doctor_and_devices_ask_with_the_token_option_or_variable_and_name_a_refusal(
    adb_env: object,
    make_daemon: DaemonFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "s3cret-board-commands"
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    token_file.chmod(0o600)
    daemon = make_daemon("--auth-token-file", str(token_file))
    monkeypatch.delenv(ENV_TOKEN, raising=False)

    assert main(["doctor", "--device", daemon.url]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] gRPC handshake" in out and "UNAUTHENTICATED" in out and ENV_TOKEN in out
    assert main(["devices", "--device", daemon.url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["daemon"]) == ("reachable", False) and "UNAUTHENTICATED" in row["refused"]
    assert main(["devices", "--device", daemon.url]) == 0
    table = capsys.readouterr().out
    assert " refused " in table and f"fix: the daemon wants a bearer token: set {ENV_TOKEN}" in table

    for given in (["--token", secret], []):  # the option, then the variable
        if not given:
            monkeypatch.setenv(ENV_TOKEN, secret)
        assert main(["doctor", "--device", daemon.url, *given]) == 0
        assert "[  OK] gRPC handshake" in capsys.readouterr().out
        assert main(["devices", "--device", daemon.url, "--json", *given]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert (row["daemon"], row["daemon_version"], row["refused"]) == (True, __version__, "")
