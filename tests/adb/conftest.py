"""Fixtures: a private adb server for the session and emulated boards per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.adb import fixtures as adb_fixtures
from tests.adb.fake_daemon import FakeDaemon, start_fake_daemon
from tests.adb.fixtures import (
    AbstractEchoServer,
    EmulatedBoard,
    PrivateAdbServer,
)
from tests.adb.host_board import point_adb_at
from tests.adb.services import DeviceProfile

MakeBoard = Callable[..., EmulatedBoard]
FakeDaemonFactory = Callable[..., FakeDaemon]


adb_server = adb_fixtures.adb_server  # the run's private adb server (a session fixture)


@pytest.fixture
def adb_env(adb_server: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch) -> PrivateAdbServer:
    """Point this process (adbutils, the transport) at the private server only."""
    point_adb_at(adb_server, monkeypatch)
    return adb_server


@pytest.fixture
def make_board(adb_env: PrivateAdbServer, tmp_path: Path) -> Iterator[MakeBoard]:
    """Factory: attach an emulated board (DeviceProfile keyword arguments) to the private server."""
    boards: list[EmulatedBoard] = []

    def make(serial_name: str = "board", **profile_args: object) -> EmulatedBoard:
        profile = DeviceProfile(tmp_path / f"root-{serial_name}", serial_name=serial_name, **profile_args)  # type: ignore[arg-type]
        board = EmulatedBoard(adb_env, profile)
        boards.append(board)
        return board

    yield make
    for board in boards:
        board.close()


@pytest.fixture
def echo_server() -> Iterator[AbstractEchoServer]:
    server = AbstractEchoServer()
    yield server
    server.close()


@pytest.fixture
def fake_daemon() -> Iterator[FakeDaemonFactory]:
    """Factory: GetInfo-only daemons (start_fake_daemon's arguments), stopped at the end."""
    started: list[FakeDaemon] = []

    def start(*args: object, **kwargs: object) -> FakeDaemon:
        daemon = start_fake_daemon(*args, **kwargs)  # type: ignore[arg-type]
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.server.stop(None)
