"""A labgrid lab on loopback for the farm tests: the real coordinator and exporters publishing RKNN
boards as resources (RKNNDaemon, RKNNAdbDaemon), places with tags.

labgrid (PyPI) pins its own grpcio and protobuf, so it lives in a venv of its own in the user's cache
folder, made once and reused, the way tests/kserve/tritonclient_venv.py makes tritonclient's (whose
venv maker this reuses). `python -m tests.farm.labgrid_lab` makes it; the tests skip, saying why, when
it cannot be made. Each process of the lab works in a folder of its own (the coordinator keeps its
places.yaml there) and is stopped by its PID.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import tomllib

from rknn_client.user_cache import cache_root
from tests.adb.fixtures import free_port
from tests.kserve.tritonclient_venv import make_venv

VERSION = "26.0.1"
START_TIMEOUT_S = 30.0


def venv_dir() -> Path:
    return cache_root() / f"labgrid-{VERSION}-with-client-deps-venv"


def client_requirements() -> list[str]:
    """What `import rknn_client` needs (pyproject's own dependencies): labgrid's environments import
    rknn_client.farm.labgrid_driver, which tests/farm/test_labgrid_driver.py runs from this tree."""
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    return list(project["project"]["dependencies"])


def ensure() -> tuple[Path | None, str]:
    """The labgrid venv's bin folder (labgrid-coordinator, -exporter, -client), made if missing;
    else None and why it could not be made."""
    folder = venv_dir()
    reason = make_venv(folder, [f"labgrid=={VERSION}", *client_requirements()])
    return (None, reason) if reason else (folder / "bin", "")


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = START_TIMEOUT_S) -> None:
    """Poll `predicate` every 0.1 s; fails with `what` if it does not hold within `timeout`."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.1)):
        if predicate():
            return
        pause.wait(0.1)
    raise AssertionError(f"never happened: {what}")


@dataclass(frozen=True)
class Resource:
    """A resource of an exporter's configuration: its class and parameters."""

    cls: str
    params: Mapping[str, object]


@dataclass
class LabProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Lab:
    """One coordinator with exporters and places; `stop()` ends every process it started."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.address = f"127.0.0.1:{free_port()}"
        self.processes: list[LabProcess] = []
        self.matches: dict[str, str] = {}  # group -> the EXPORTER/GROUP/CLASS match of its place
        self.coordinator = self._start("coordinator", ["labgrid-coordinator", "--listen", self.address])
        wait_until(self._coordinator_answers, f"the coordinator listening on {self.address}")

    def _start(self, name: str, command: list[str], *args: str) -> LabProcess:
        folder = self.root / name
        folder.mkdir(parents=True)
        log_path = folder / "log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(self.bin_dir / command[0]), *command[1:], *args],
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started = LabProcess(name, process, log_path)
        self.processes.append(started)
        return started

    def _coordinator_answers(self) -> bool:
        assert self.coordinator.process.poll() is None, self.coordinator.log_text()
        host, port = self.address.rsplit(":", 1)
        with socket.socket() as probe:
            return probe.connect_ex((host, int(port))) == 0

    def client(self, *args: str) -> str:
        """`labgrid-client -x COORDINATOR ARGS`: its stdout; fails the test when it fails."""
        done = subprocess.run(
            [str(self.bin_dir / "labgrid-client"), "-x", self.address, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"labgrid-client {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout

    def add_exporters(self, exporters: Mapping[str, Mapping[str, Resource]]) -> None:
        """Exporters (name -> group -> resource), each publishing one resource per group (groups are
        named after the boards); returns once the coordinator lists them all."""
        started = []
        for name, groups in exporters.items():
            config = self.root / f"{name}.yaml"
            config.write_text(
                "".join(
                    f"{group}:\n  {r.cls}:\n" + "".join(f"    {k}: {v}\n" for k, v in r.params.items())
                    for group, r in groups.items()
                )
            )
            options = ["--coordinator", self.address, "--name", name, "--hostname", "127.0.0.1"]
            started.append(self._start(f"exporter-{name}", ["labgrid-exporter", *options], str(config)))
            self.matches.update({group: f"{name}/{group}/{r.cls}" for group, r in groups.items()})
        wanted = {self.matches[group] for groups in exporters.values() for group in groups}

        def listed() -> bool:
            assert all(e.process.poll() is None for e in started), [e.log_text() for e in started]
            return wanted <= set(self.client("resources").split())

        wait_until(listed, "the exporters' resources at the coordinator")

    def add_places(self, places: Mapping[str, Mapping[str, str]]) -> None:
        """Places (name -> tags), each matching the resource of the group of its name, made as an
        admin makes them (side by side: each labgrid-client call takes a while)."""

        def add(name: str) -> None:
            self.client("-p", name, "create")
            self.client("-p", name, "add-match", self.matches[name])
            self.client("-p", name, "set-tags", *(f"{k}={v}" for k, v in places[name].items()))

        with ThreadPoolExecutor(len(places)) as pool:
            list(pool.map(add, places))

    def acquired(self) -> dict[str, str]:
        """Place -> who holds it, as `labgrid-client who` shows it (USER HOST PLACE CHANGED)."""
        rows = [line.split() for line in self.client("who").splitlines()[1:]]
        return {row[2]: f"{row[1]}/{row[0]}" for row in rows if row}

    def reservations(self) -> list[dict[str, str]]:
        """Every reservation the coordinator has, as `labgrid-client reservations` shows it (the
        fields of each: owner, token, state, prio when not 0, created, timeout)."""
        found: list[dict[str, str]] = []
        for line in self.client("reservations").splitlines():
            if line.startswith("Reservation "):
                found.append({})
            elif found and line.startswith("  ") and not line.startswith("    ") and ":" in line:
                key, value = line.strip().split(":", 1)
                found[-1][key] = value.strip()
        return found

    def reservation_states(self) -> list[str]:
        """The state of every reservation the coordinator has."""
        return sorted(r["state"] for r in self.reservations())

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


def main() -> int:
    bin_dir, reason = ensure()
    print(
        f"labgrid {VERSION}: {bin_dir}" if bin_dir else f"labgrid: {reason}; the labgrid farm tests will skip"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
