"""Three rounds; in each, every server in turn (the order rotated from round to round, so no
server always runs first or last on a noisy machine) is started alone, measured on each of its
doors for both models at concurrency 1 and 8 with the same drivers, and stopped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.peers.drivers import Driver
from bench.peers.models import BenchModel
from bench.peers.servers import Running, StartError

ROUNDS = 3
SECONDS = 2.0  # each measured window
CONCURRENCY = (1, 8)
Start = Callable[[Path, list[BenchModel]], Running]


@dataclass(frozen=True)
class Contender:
    name: str
    start: Start
    doors: tuple[str, ...]  # rknn_v1, v2_grpc, v2_rest (binary tensors), v2_rest_json


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


def measure_once(
    contender: Contender, work: Path, models: list[BenchModel], pythons: Pythons
) -> dict[str, Any]:
    """One start of one server: {"start_s", "figures": {door: {model: {"c1": {...}, "c8": {...}}}}},
    each measurement its figures or {"error": why}; {"error": why} when it did not start."""
    try:
        running = contender.start(work, models)
    except (StartError, OSError) as exc:
        return {"error": str(exc)}
    figures: dict[str, Any] = {}
    try:
        for door in contender.doors:
            driver = _driver(door, pythons, work / f"driver-{door}.log")
            try:
                for model in models:
                    for concurrency in CONCURRENCY:
                        got = driver.measure(
                            _job(door, running.doors[door], model, concurrency), running.tree
                        )
                        cell = asdict(got) if not isinstance(got, str) else {"error": got}
                        figures.setdefault(door, {}).setdefault(model.name, {})[f"c{concurrency}"] = cell
                        print(
                            f"  {contender.name} {door} {model.name} c{concurrency}: {_short(cell)}",
                            flush=True,
                        )
            finally:
                driver.close()
    finally:
        running.stop()
    return {"start_s": running.start_s, "figures": figures}


def _short(cell: dict[str, Any]) -> str:
    if "error" in cell:
        return f"error: {cell['error'][:200]}"
    return f"p50 {cell['p50_ms']:.2f} ms, {cell['throughput_rps']:.0f}/s, CPU {cell['server_cpu_s_per_1000_requests']:.2f} s/1000"


def run_rounds(
    contenders: list[Contender], work: Path, models: list[BenchModel], pythons: Pythons
) -> list[dict[str, Any]]:
    """Each round's results by server name."""
    rounds = []
    for number in range(ROUNDS):
        order = contenders[number % len(contenders) :] + contenders[: number % len(contenders)]
        print(f"peers round {number + 1}/{ROUNDS}: {', '.join(c.name for c in order)}", flush=True)
        rounds.append(
            {c.name: _guarded(c, work / f"round{number + 1}" / c.name, models, pythons) for c in order}
        )
    return rounds


def _guarded(contender: Contender, work: Path, models: list[BenchModel], pythons: Pythons) -> dict[str, Any]:
    """measure_once, with whatever else goes wrong said as the server's error: the rest goes on."""
    try:
        return measure_once(contender, work, models, pythons)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:800]}
