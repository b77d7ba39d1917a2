"""Fan-out: one model on every chosen device in parallel, each compared with a reference.

Each device is reserved for its run (so nobody else's sessions skew its timing), then runs the
inputs once (the outputs compared with the reference's by cosine similarity), then warm-up runs
and `runs` timed runs (the latency's spread), per-layer times and memory. A device that fails,
is unreachable or is cancelled (`Farm.cancel()`, Ctrl-C) is recorded with the stage and error;
it never stops the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np

from rknn_client.device import Device
from rknn_client.farm.compare import cosine_similarity
from rknn_client.farm.inventory import DeviceEntry
from rknn_client.farm.pool import Cancelled, Farm, NoMatchingDevice, NoReachableDevice
from rknn_client.transport.private import start_private_daemon
from rknn_proto.messages import EvalPerfResponse

# Called with (device name, stage) as each device moves on: each of STAGES in order ("time" once
# per timed run), then "done", "failed" or "cancelled".
Observer = Callable[[str, str], None]
STAGES = ("reserve", "load", "run", "warm-up", "time", "perf", "memory")
HOST_REFERENCE = "host"
DEVICE_REFERENCE_PREFIX = "device:"


class DevicePool(Protocol):
    """Where a fan-out's devices come from and how one is held for its run: a Farm (farm.toml, the
    daemons' own reservations) or a LabgridFarm (places of labgrid's coordinator)."""

    @property
    def entries(self) -> list[DeviceEntry]: ...

    @property
    def cancelled(self) -> bool: ...

    def acquire(self, *, name: str, timeout: float | None = None) -> AbstractContextManager[Device]: ...


@dataclass
class LayerTime:
    name: str
    op_type: str
    time_us: float


@dataclass
class LatencyStats:
    """The spread of the timed runs: the runtime's own time of one inference, in µs."""

    runs: int
    p50_us: float
    p90_us: float
    min_us: float
    max_us: float

    @classmethod
    def of(cls, times_us: Sequence[float]) -> LatencyStats:
        values = np.asarray(times_us, dtype=np.float64)
        p50, p90 = np.percentile(values, [50, 90])
        return cls(len(values), float(p50), float(p90), float(values.min()), float(values.max()))


@dataclass
class DeviceResult:
    name: str
    address: str
    labels: dict[str, str]
    place: str = ""  # labgrid's place (the name), "" outside labgrid
    host: str = ""  # the labgrid exporter that publishes it
    ok: bool = False
    is_reference: bool = False
    error: str = ""
    failed_stage: str = ""
    cancelled: bool = False  # stopped by Ctrl-C (at failed_stage), not failed; `latency` has the runs done
    soc: str = ""
    daemon_version: str = ""
    runtime: str = ""
    runtime_version: str = ""
    driver_version: str = ""
    latency: LatencyStats | None = None
    perf_total_us: float = 0.0  # EvalPerf's total of one profiled inference (the layers' run)
    memory_bytes: int = 0
    cosine: list[float] = field(default_factory=list)  # one per output, against the reference
    agrees: bool | None = None  # every cosine >= threshold; None when nothing was compared
    layers: list[LayerTime] = field(default_factory=list)

    @property
    def min_cosine(self) -> float | None:
        return min(self.cosine) if self.cosine else None


@dataclass
class FanoutReport:
    model: str
    reference: str
    threshold: float
    inputs: list[dict[str, object]]
    started_at: str
    duration_s: float
    devices: list[DeviceResult]
    warmup: int = 0
    runs: int = 0
    reference_layers: list[LayerTime] = field(default_factory=list)  # per-layer times of the reference
    cancelled: bool = False  # stopped early (Ctrl-C): the devices not finished say so


@dataclass
class DeviceOutcome:
    result: DeviceResult
    outputs: list[np.ndarray] | None


def _quiet(name: str, stage: str) -> None:
    return None


@dataclass(frozen=True)
class Timing:
    """How a device's latency is measured: `warmup` untimed runs, then `runs` timed ones."""

    warmup: int = 2
    runs: int = 10


def run_on_device(
    farm: DevicePool,
    entry: DeviceEntry,
    model: Path,
    inputs: Sequence[np.ndarray],
    reserve_timeout_s: float | None,
    observer: Observer = _quiet,
    timing: Timing = Timing(),
) -> DeviceOutcome:
    """Reserve one device, run, time and measure the model there; failures become the result.
    After `farm.cancel()` it stops at the next step, closing its session and giving its lease back
    itself, and keeps the timed runs done."""
    result = DeviceResult(entry.name, entry.address, dict(entry.labels), entry.place, entry.host)
    stage = "reserve"
    times: list[float] = []

    def go_on() -> None:
        if farm.cancelled:
            raise Cancelled(f"cancelled during {stage}")

    def step(name: str) -> None:
        nonlocal stage
        go_on()
        stage = name
        observer(entry.name, name)

    try:
        step("reserve")
        with farm.acquire(name=entry.name, timeout=reserve_timeout_s) as device:
            step("load")
            _describe(result, entry, device)
            with device.load(model, perf_debug=True, eval_mem=True) as session:
                step("run")
                outputs = session.run(list(inputs))
                step("warm-up")
                for _ in range(timing.warmup):
                    go_on()
                    session.run(list(inputs))
                for _ in range(timing.runs):
                    step("time")
                    session.run(list(inputs))
                    times.append(float(session.last_run_time_us))
                step("perf")
                perf = session.perf(fix_freq=True)
                result.perf_total_us = perf.total_time_us
                result.layers = layer_times(perf)
                step("memory")
                result.memory_bytes = session.memory().total_memory
    except Exception as exc:  # a failing device is a result, not the end of the run
        cancelled = farm.cancelled and not isinstance(exc, (NoReachableDevice, NoMatchingDevice))
        result.cancelled = cancelled
        result.error = "cancelled (Ctrl-C)" if cancelled else f"{type(exc).__name__}: {exc}"
        result.failed_stage = stage
        result.latency = LatencyStats.of(times) if times else None
        observer(entry.name, "cancelled" if cancelled else "failed")
        return DeviceOutcome(result, None)
    result.latency = LatencyStats.of(times) if times else None
    result.ok = True
    observer(entry.name, "done")
    return DeviceOutcome(result, outputs)


def layer_times(perf: EvalPerfResponse) -> list[LayerTime]:
    return [LayerTime(r.name or r.op_type, r.op_type, r.time_us) for r in perf.layers]


def _describe(result: DeviceResult, entry: DeviceEntry, device: Device) -> None:
    info = device.info()
    result.soc = entry.soc(info.soc)
    result.daemon_version = info.daemon_version
    result.runtime = info.runtime
    result.runtime_version = info.runtime_version
    result.driver_version = info.driver_version


def host_reference(
    model: Path, inputs: Sequence[np.ndarray]
) -> tuple[str, list[np.ndarray], list[LayerTime]]:
    """Outputs and per-layer times of the host runtime (ONNX Runtime in a private daemon): the
    toolkit's simulator."""
    with Device(start_private_daemon()) as device:
        info = device.info()
        with device.load(model, perf_debug=True) as session:
            outputs = session.run(list(inputs))
            layers = layer_times(session.perf(fix_freq=False))
    return f"host runtime ({info.runtime_version}, private daemon)", outputs, layers


def _compare(
    result: DeviceResult, outputs: list[np.ndarray], reference: Sequence[np.ndarray], threshold: float
) -> None:
    if len(outputs) != len(reference):
        result.error = f"the device returned {len(outputs)} output(s); the reference has {len(reference)}"
        result.agrees = False
        return
    result.cosine = [cosine_similarity(o, r) for o, r in zip(outputs, reference, strict=True)]
    result.agrees = all(c >= threshold for c in result.cosine)


def run_fanout(
    farm: DevicePool,
    model: Path,
    inputs: Sequence[np.ndarray],
    *,
    entries: Sequence[DeviceEntry] | None = None,
    reference: str = HOST_REFERENCE,
    reference_model: Path | None = None,
    concurrency: int = 4,
    threshold: float = 0.99,
    reserve_timeout_s: float | None = 300.0,
    observer: Observer = _quiet,
    timing: Timing = Timing(),
) -> FanoutReport:
    """Run `model` on every device of `entries` (default: the whole farm), compare, and report.

    `reference` is "host" (the host runtime runs `reference_model`, default `model`) or
    "device:NAME" (that farm device runs first and is the golden one). After `farm.cancel()` the
    devices still running stop and the report (`cancelled`) says which did not finish.
    """
    chosen = list(farm.entries if entries is None else entries)
    started = datetime.now(timezone.utc)
    start = time.monotonic()
    results: dict[str, DeviceResult] = {}
    golden_outputs: list[np.ndarray] | None = None
    reference_layers: list[LayerTime] = []

    def run_one(entry: DeviceEntry) -> DeviceOutcome:
        return run_on_device(farm, entry, model, inputs, reserve_timeout_s, observer, timing)

    if reference.startswith(DEVICE_REFERENCE_PREFIX):
        golden_name = reference.removeprefix(DEVICE_REFERENCE_PREFIX)
        golden = _by_name(farm.entries, golden_name)
        outcome = run_one(golden)
        outcome.result.is_reference = True
        results[golden.name] = outcome.result
        golden_outputs = outcome.outputs
        reference_layers = outcome.result.layers
        reference_text = f"device {golden.name}"
        if golden_outputs is not None:
            _compare(outcome.result, golden_outputs, golden_outputs, threshold)
    elif reference == HOST_REFERENCE:
        try:
            if farm.cancelled:
                raise Cancelled("cancelled before the reference ran")
            reference_text, golden_outputs, reference_layers = host_reference(
                reference_model or model, inputs
            )
        except Exception:
            if not farm.cancelled:  # Ctrl-C reaches the private daemon too; then nothing is compared
                raise
            reference_text = "host runtime (cancelled)"
    else:
        raise ValueError(f"reference {reference!r} is neither 'host' nor 'device:NAME'")
    rest = [e for e in chosen if e.name not in results]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        outcomes = list(pool.map(run_one, rest))
    for outcome in outcomes:
        if outcome.outputs is not None and golden_outputs is not None:
            _compare(outcome.result, outcome.outputs, golden_outputs, threshold)
        results[outcome.result.name] = outcome.result
    order = [e.name for e in chosen] + [n for n in results if n not in {e.name for e in chosen}]
    return FanoutReport(
        model=str(model),
        reference=reference_text,
        threshold=threshold,
        inputs=[{"shape": list(a.shape), "dtype": str(a.dtype)} for a in inputs],
        started_at=started.isoformat(timespec="seconds"),
        duration_s=time.monotonic() - start,
        devices=[results[n] for n in order],
        warmup=timing.warmup,
        runs=timing.runs,
        reference_layers=reference_layers,
        cancelled=farm.cancelled,
    )


def _by_name(entries: Sequence[DeviceEntry], name: str) -> DeviceEntry:
    for entry in entries:
        if entry.name == name:
            return entry
    raise ValueError(f"the golden device {name!r} is not in the farm ({', '.join(e.name for e in entries)})")


def entries_matching(
    farm: Farm, soc: str | None = None, labels: Mapping[str, str] | None = None
) -> list[DeviceEntry]:
    """The devices a fan-out covers: matching labels, and the SoC by label or by probe. A device
    that does not answer and has no soc label stays in (it is then reported with its error)."""
    chosen = farm.select(labels)
    if not soc:
        return chosen
    statuses = farm.statuses(chosen)
    return [
        s.entry for s in statuses if (s.soc if s.healthy else s.entry.labels.get("soc", soc)) == soc.lower()
    ]
