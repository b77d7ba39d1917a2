"""Latency of a session over many runs, as perf_analyzer reports it: warm-up first, then percentiles.

Each run's time is the daemon's own (`run_time_us`: the runtime's time, without the network), the same
figure eval_perf's total is made of, so the CLI and the toolkit flow agree. One run alone says little on
a busy machine; the median of many says what the model costs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rknn_client.frame_spec import FrameSpec
from rknn_client.session import Session


@dataclass(frozen=True)
class Latency:
    """Daemon-side run times in microseconds, and the round trip as this client saw it."""

    runs: int
    warmup: int
    p50_us: float
    p90_us: float
    p99_us: float
    min_us: float
    max_us: float
    round_trip_p50_us: float
    interrupted: bool = False  # Ctrl-C ended the timed runs early: these are the ones done

    @property
    def fps(self) -> float:
        return 1e6 / self.p50_us if self.p50_us > 0 else 0.0

    @classmethod
    def of(
        cls, run_us: Sequence[float], round_trip_us: Sequence[float], warmup: int, interrupted: bool = False
    ) -> Latency:
        p50, p90, p99 = (float(v) for v in np.percentile(run_us, [50, 90, 99]))
        return cls(
            runs=len(run_us),
            warmup=warmup,
            p50_us=p50,
            p90_us=p90,
            p99_us=p99,
            min_us=float(min(run_us)),
            max_us=float(max(run_us)),
            round_trip_p50_us=float(np.median(round_trip_us)),
            interrupted=interrupted,
        )


def measure(session: Session, frame: FrameSpec, *, warmup: int, runs: int) -> Latency:
    """`warmup` untimed runs, then `runs` timed ones. Ctrl-C during the timed runs keeps the runs
    done (`interrupted`); before the first one there is nothing to report and KeyboardInterrupt goes on."""
    if runs < 1:
        raise ValueError(f"--runs must be at least 1, not {runs}")
    for _ in range(max(warmup, 0)):
        session.run_frame(frame)
    run_us: list[float] = []
    round_trip_us: list[float] = []
    try:
        for _ in range(runs):
            start = time.perf_counter()
            session.run_frame(frame)
            round_trip_us.append((time.perf_counter() - start) * 1e6)
            run_us.append(float(session.last_run_time_us) or round_trip_us[-1])
    except KeyboardInterrupt:
        if not run_us:
            raise
        return Latency.of(run_us, round_trip_us[: len(run_us)], max(warmup, 0), interrupted=True)
    return Latency.of(run_us, round_trip_us, max(warmup, 0))


def sample_inputs(session: Session) -> list[np.ndarray]:
    """Zeros of each input's shape and dtype (dynamic dimensions as 1), for timing without data."""
    return [np.zeros([max(d, 1) for d in spec.shape], dtype=spec.dtype) for spec in session.inputs]
