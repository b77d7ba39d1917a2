"""client/transport/adb.py against a private adb server and emulated boards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rknn_client.transport.adb import (
    AdbDeviceAmbiguous,
    AdbDeviceNotFound,
    AdbDeviceNotReady,
    AdbServerUnavailable,
    connect_adb_server,
    list_adb_devices,
    open_adb,
)
from rknn_client.transport.base import TransportError
from tests.adb.conftest import MakeBoard
from tests.adb.fixtures import AbstractEchoServer, PrivateAdbServer, free_port


def forwarded_ports(server: PrivateAdbServer) -> set[int]:
    listing = server.adb("forward", "--list").stdout.split()
    return {int(word.removeprefix("tcp:")) for word in listing[1::3]}


def round_trip(port: int, payload: bytes) -> bytes:
    """Send and read the same length back (adb forwards have no half-close)."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(payload)
        answer = bytearray()
        while len(answer) < len(payload) and (chunk := connection.recv(65536)):
            answer += chunk
        return bytes(answer)


@pytest.fixture
def tcp_echo() -> Iterator[int]:
    """A loopback TCP server answering upper-cased, for the tcp: fallback."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                while data := connection.recv(65536):
                    connection.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join()


def test_list_shows_boards_with_state_and_model(make_board: MakeBoard) -> None:
    board = make_board(model="RK3588 EVB")
    devices = {device.serial: device for device in list_adb_devices()}
    assert devices[board.serial].state == "device"
    assert devices[board.serial].model == "RK3588_EVB"
    assert devices[board.serial].is_network


def test_open_adb_forwards_to_the_abstract_socket_and_close_removes_it(
    adb_env: PrivateAdbServer, make_board: MakeBoard, echo_server: AbstractEchoServer
) -> None:
    board = make_board()
    endpoint = open_adb(None, socket_name=echo_server.name)
    host, port = endpoint.grpc_target.rsplit(":", 1)
    assert (host, endpoint.kind) == ("127.0.0.1", "adb")
    assert board.serial in endpoint.description
    assert int(port) in forwarded_ports(adb_env)
    assert round_trip(int(port), b"rknn") == b"RKNN"
    endpoint.close()
    endpoint.close()
    assert int(port) not in forwarded_ports(adb_env)


def test_open_adb_tcp_fallback(make_board: MakeBoard, tcp_echo: int) -> None:
    board = make_board()
    endpoint = open_adb(board.serial, tcp_port=tcp_echo)
    try:
        assert f"tcp:{tcp_echo}" in endpoint.description
        assert round_trip(int(endpoint.grpc_target.rsplit(":", 1)[1]), b"npu") == b"NPU"
    finally:
        endpoint.close()


def test_several_boards_need_a_serial(make_board: MakeBoard, echo_server: AbstractEchoServer) -> None:
    first, second = make_board("first"), make_board("second")
    with pytest.raises(AdbDeviceAmbiguous) as raised:
        open_adb(None, socket_name=echo_server.name)
    assert first.serial in str(raised.value) and second.serial in str(raised.value)
    endpoint = open_adb(second.serial, socket_name=echo_server.name)
    try:
        assert second.serial in endpoint.description
    finally:
        endpoint.close()


def test_no_board_says_how_to_attach_one(adb_env: PrivateAdbServer) -> None:
    with pytest.raises(AdbDeviceNotFound) as raised:
        open_adb(None)
    assert "adb connect" in raised.value.fix


def test_unknown_serial_lists_the_attached_ones(make_board: MakeBoard) -> None:
    board = make_board()
    with pytest.raises(AdbDeviceNotFound) as raised:
        open_adb("no-such-board")
    assert board.serial in raised.value.problem
    assert isinstance(raised.value, TransportError)


def test_offline_board_is_not_ready(adb_env: PrivateAdbServer, make_board: MakeBoard) -> None:
    board = make_board()
    board.go_offline()
    state = adb_env.wait_for_state(board.serial, {"offline", None})
    expected = AdbDeviceNotReady if state == "offline" else AdbDeviceNotFound
    with pytest.raises(expected):
        open_adb(board.serial)


def test_missing_server_is_started_only_on_the_configured_port(
    adb_env: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    with pytest.raises(AdbServerUnavailable) as raised:
        connect_adb_server(start=False)
    assert str(port) in raised.value.problem
    try:
        client = connect_adb_server(start=True)
        assert client.port == port
        assert client.server_version() > 0
    finally:
        stop = [adb_env.binary, "-P", str(port), "kill-server"]
        subprocess.run(stop, env=os.environ, check=False, timeout=30)


def test_forwards_are_removed_at_interpreter_exit(
    adb_env: PrivateAdbServer, make_board: MakeBoard, echo_server: AbstractEchoServer
) -> None:
    make_board()
    script = textwrap.dedent(
        f"""
        from rknn_client.transport.adb import open_adb
        endpoint = open_adb(None, socket_name={echo_server.name!r})
        print(endpoint.grpc_target.rsplit(":", 1)[1], flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert int(result.stdout.strip()) not in forwarded_ports(adb_env)
