"""Three rounds. In each, every server is started (one after another, in an order rotated from round
to round) and all stay up while they are measured side by side: for each model and concurrency, each
door's windows follow one another across the servers (in an order rotated from cell to cell), so a
peer's window and ours for the same cell are seconds apart, not minutes. Only the server being driven
is busy: the others idle (about 1-3 ms of CPU a second each, measured here). Each server's CPU and RSS
are read from its own process tree."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.peers.drivers import Driver
from bench.peers.models import BenchModel
from bench.peers.servers import Running, StartError

ROUNDS = 3
SECONDS = 2.0  # each measured window
CONCURRENCY = (1, 8)
# The doors in the order each cell measures them: the ones compared with each other next to each other.
DOORS = ("v2_grpc", "rknn_v1", "v2_rest", "v2_rest_json")
Start = Callable[[Path, list[BenchModel]], Running]
T = TypeVar("T")


@dataclass(frozen=True)
class Contender:
    name: str
    start: Start
    doors: tuple[str, ...]  # some of DOORS: rknn_v1, v2_grpc, v2_rest (binary tensors), v2_rest_json


@dataclass(frozen=True)
class Pythons:
    ours: Path  # the project venv's, for drive_rknn.py
    tritonclient: Path  # for drive_v2.py


def _job(door: str, url: str, model: BenchModel, concurrency: int) -> dict[str, Any]:
    job: dict[str, Any] = {**model.job(), "url": url, "concurrency": concurrency, "seconds": SECONDS}
    if door == "rknn_v1":
        job["model"] = str(model.file)  # uploaded (then cached by digest), as rknn_client users do
    job["protocol"] = "grpc" if door == "v2_grpc" else "http"
    job["binary"] = door != "v2_rest_json"
    return job


def _driver(door: str, pythons: Pythons, log: Path) -> Driver:
    if door == "rknn_v1":
        return Driver(pythons.ours, "drive_rknn.py", log)
    return Driver(pythons.tritonclient, "drive_v2.py", log)


def rotated(items: Sequence[T], by: int) -> list[T]:
    """`items` starting at position `by` (modulo their count), wrapping around."""
    if not items:
        return []
    at = by % len(items)
    return [*items[at:], *items[:at]]


def _short(cell: dict[str, Any]) -> str:
    if "error" in cell:
        return f"error: {cell['error'][:200]}"
    return f"p50 {cell['p50_ms']:.2f} ms, {cell['throughput_rps']:.0f}/s, CPU {cell['server_cpu_s_per_1000_requests']:.2f} s/1000"


class _Round:
    """One round's servers, their drivers (one per server and door, made on first use) and results:
    {server: {"start_s", "figures": {door: {model: {"c1": {...}, "c8": {...}}}}}}, each measurement
    its figures or {"error": why}; {server: {"error": why}} for one that did not start."""

    def __init__(self, work: Path, pythons: Pythons) -> None:
        self.work = work
        self.pythons = pythons
        self.running: dict[str, Running] = {}
        self.drivers: dict[tuple[str, str], Driver] = {}
        self.results: dict[str, dict[str, Any]] = {}

    def start(self, contender: Contender, models: list[BenchModel]) -> None:
        try:
            running = contender.start(self.work / contender.name, models)
        except (StartError, OSError) as exc:
            self.results[contender.name] = {"error": str(exc)}
            return
        except Exception as exc:
            self.results[contender.name] = {"error": f"{type(exc).__name__}: {exc}"[:800]}
            return
        self.running[contender.name] = running
        self.results[contender.name] = {"start_s": running.start_s, "figures": {}}

    def measure(self, contender: Contender, door: str, model: BenchModel, concurrency: int) -> None:
        """One window's figures, or its error (whatever went wrong is the window's: the rest goes on)."""
        try:
            cell = self._window(contender, door, model, concurrency)
        except Exception as exc:
            cell = {"error": f"{type(exc).__name__}: {exc}"[:800]}
        figures = self.results[contender.name]["figures"]
        figures.setdefault(door, {}).setdefault(model.name, {})[f"c{concurrency}"] = cell
        print(f"  {contender.name} {door} {model.name} c{concurrency}: {_short(cell)}", flush=True)

    def _window(self, contender: Contender, door: str, model: BenchModel, concurrency: int) -> dict[str, Any]:
        running = self.running[contender.name]
        driver = self.drivers.get((contender.name, door))
        if driver is None:
            log = self.work / contender.name / f"driver-{door}.log"
            driver = self.drivers[contender.name, door] = _driver(door, self.pythons, log)
        got = driver.measure(_job(door, running.doors[door], model, concurrency), running.tree)
        return asdict(got) if not isinstance(got, str) else {"error": got}

    def close(self) -> None:
        """Every driver ended and every server stopped, by PID, whatever failed before."""
        for driver in self.drivers.values():
            driver.close()
        for running in self.running.values():
            running.stop()


def _windows(
    contenders: list[Contender], models: list[BenchModel]
) -> Iterator[tuple[Contender, str, BenchModel, int]]:
    """Every (server, door, model, concurrency) window of a round, cell by cell; within a cell door by
    door, the servers in an order rotated from cell to cell."""
    cell = 0
    for model in models:
        for concurrency in CONCURRENCY:
            for door in DOORS:
                having = [c for c in contenders if door in c.doors]
                for contender in rotated(having, cell):
                    yield contender, door, model, concurrency
                cell += 1


def measure_round(
    contenders: list[Contender], work: Path, models: list[BenchModel], pythons: Pythons
) -> dict[str, dict[str, Any]]:
    """One round: the contenders started in the order given, measured side by side, then stopped.
    A failure of one window or one server is its error; the rest goes on."""
    round_ = _Round(work, pythons)
    try:
        for contender in contenders:
            round_.start(contender, models)
        up = [c for c in contenders if c.name in round_.running]
        for contender, door, model, concurrency in _windows(up, models):
            round_.measure(contender, door, model, concurrency)
    finally:
        round_.close()
    return round_.results


def run_rounds(
    contenders: list[Contender], work: Path, models: list[BenchModel], pythons: Pythons
) -> list[dict[str, Any]]:
    """Each round's results by server name."""
    rounds = []
    for number in range(ROUNDS):
        order = rotated(contenders, number)
        print(f"peers round {number + 1}/{ROUNDS}: {', '.join(c.name for c in order)}", flush=True)
        rounds.append(measure_round(order, work / f"round{number + 1}", models, pythons))
    return rounds
