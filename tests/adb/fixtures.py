"""Real adb for tests: a private adb server on a free port and emulated boards attached to it.

Never touches a user's adb server: the server runs on its own port (ANDROID_ADB_SERVER_PORT), with
its own HOME for keys, without mDNS, and is killed by PID.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import adbutils
import pytest

from tests.adb.emulator import EmulatorThread
from tests.adb.services import DeviceProfile

_STARTUP_SECONDS = 60


def find_adb() -> str | None:
    """adbutils' bundled adb (or ADBUTILS_ADB_PATH / PATH), else Debian's."""
    try:
        return adbutils.adb_path()
    except adbutils.AdbError:
        return shutil.which("adb")


def free_port() -> int:
    """A loopback port nothing listens on (at the time of asking)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateAdbServer:
    """`adb server nodaemon` on a free port: our own child, so stopping it is killing that PID."""

    def __init__(self, binary: str, home: Path) -> None:
        self.binary = binary
        self.port = free_port()
        home.mkdir(parents=True, exist_ok=True)
        self.env = os.environ | {
            "ANDROID_ADB_SERVER_PORT": str(self.port),
            "ADB_MDNS": "0",
            "ADB_MDNS_OPENSCREEN": "0",
            "HOME": str(home),
        }
        self._log = (home / "adb-server.log").open("wb")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [self.binary, "-P", str(self.port), "server", "nodaemon"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + _STARTUP_SECONDS
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"private adb server on port {self.port} did not start")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._log.close()

    def client(self) -> adbutils.AdbClient:
        return adbutils.AdbClient(host="127.0.0.1", port=self.port)

    def adb(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the adb binary against this server."""
        return subprocess.run(
            [self.binary, "-P", str(self.port), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def state_of(self, serial: str) -> str | None:
        return next((info.state for info in self.client().list() if info.serial == serial), None)

    def wait_for_state(self, serial: str, wanted: set[str | None]) -> str | None:
        """Poll `adb devices` until the serial is in one of the wanted states (None = absent)."""
        deadline = time.monotonic() + _STARTUP_SECONDS
        while (state := self.state_of(serial)) not in wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"{serial} stayed {state!r}, wanted one of {wanted}")
            time.sleep(0.05)
        return state


@dataclass
class EmulatedBoard:
    """An emulated board attached to a private adb server with `adb connect`."""

    server: PrivateAdbServer
    profile: DeviceProfile
    thread: EmulatorThread = field(init=False)
    serial: str = field(init=False)

    def __post_init__(self) -> None:
        self.profile.root.mkdir(parents=True, exist_ok=True)
        self.thread = EmulatorThread(self.profile)
        port = self.thread.start()
        self.serial = f"127.0.0.1:{port}"
        answer = self.server.adb("connect", self.serial).stdout
        if "connected" not in answer:
            raise RuntimeError(f"adb connect {self.serial}: {answer.strip()}")
        self.server.wait_for_state(self.serial, {"device"})

    def go_offline(self) -> None:
        """Pull the plug: the emulator hangs up and stops listening."""
        self.thread.stop()

    def close(self) -> None:
        self.server.adb("disconnect", self.serial, check=False)
        self.thread.stop()


class AbstractEchoServer:
    """A local abstract UNIX socket server that echoes everything back upper-cased."""

    def __init__(self) -> None:
        self.name = f"adbtest-{uuid.uuid4().hex[:12]}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.name)
        self._listener.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(connection,), daemon=True).start()

    @staticmethod
    def _echo(connection: socket.socket) -> None:
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data.upper())

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join()


@pytest.fixture(scope="session")
def adb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateAdbServer]:
    """A private adb server of this run (conftests of the suites that use adb import this fixture)."""
    binary = find_adb()
    if binary is None:
        pytest.skip("no adb binary: pip install adbutils or apt-get install adb")
    server = PrivateAdbServer(binary, tmp_path_factory.mktemp("adb-home"))
    server.start()
    yield server
    server.stop()
