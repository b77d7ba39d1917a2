"""Measurement windows, as perf_analyzer takes them: the load runs on while the outcomes of each
fixed interval are collected; the step is stable once the last three windows agree (throughput and
mean latency each within the stability percentage, max over min), and its figures are those windows'.

Every request the load makes ends in exactly one place: a warm-up run, a window (completed, failed or
dropped), or after the last window (in flight when the load stopped, or dropped then), so the counts
of a step always add up to the requests it made.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# perf_analyzer's rule: the last 3 windows decide stability, and make the step's figures.
STABLE_WINDOWS = 3


class Kind(enum.Enum):
    OK = "ok"
    ERROR = "error"
    DROP = "drop"


@dataclass(frozen=True)
class Outcome:
    """One resolved request: its latency (seconds; from the send in a closed loop, from the scheduled
    time in an open loop) and the daemon's own run time (microseconds; 0 when it sent none)."""

    kind: Kind
    latency_s: float = 0.0
    server_us: float = 0.0


@dataclass(frozen=True)
class Percentiles:
    avg: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        """NaN throughout for no values (a window nothing completed in has no latency)."""
        if not values:
            return cls(*(float("nan"),) * 4)
        p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
        return cls(float(np.mean(values)), p50, p90, p99)

    def scaled(self, factor: float) -> Percentiles:
        return Percentiles(self.avg * factor, self.p50 * factor, self.p90 * factor, self.p99 * factor)


@dataclass(frozen=True)
class Window:
    """The outcomes recorded during one interval of `duration_s`."""

    duration_s: float
    outcomes: tuple[Outcome, ...]

    def count(self, kind: Kind) -> int:
        return sum(1 for o in self.outcomes if o.kind is kind)

    @property
    def completed(self) -> int:
        return self.count(Kind.OK)

    @property
    def throughput(self) -> float:
        """Completed requests per second."""
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def latencies_s(self) -> list[float]:
        return [o.latency_s for o in self.outcomes if o.kind is Kind.OK]

    @property
    def server_us(self) -> list[float]:
        return [o.server_us for o in self.outcomes if o.kind is Kind.OK and o.server_us > 0]


def _spread_ok(values: Sequence[float], percent: float) -> bool:
    low, high = min(values), max(values)
    return low > 0 and high / low <= 1 + percent / 100


def is_stable(windows: Sequence[Window], percent: float) -> bool:
    """Whether the last STABLE_WINDOWS windows agree within `percent` on throughput and mean latency."""
    last = windows[-STABLE_WINDOWS:]
    if len(last) < STABLE_WINDOWS or any(w.completed == 0 for w in last):
        return False
    means = [Percentiles.of(w.latencies_s).avg for w in last]
    return _spread_ok([w.throughput for w in last], percent) and _spread_ok(means, percent)


@dataclass(frozen=True)
class Summary:
    """A step's figures: over its last STABLE_WINDOWS windows (fewer when it ran fewer)."""

    windows: int
    duration_s: float
    completed: int
    errors: int
    drops: int
    throughput: float
    latency_ms: Percentiles
    server_ms: Percentiles

    @classmethod
    def of(cls, windows: Sequence[Window]) -> Summary:
        used = list(windows[-STABLE_WINDOWS:])
        duration = sum(w.duration_s for w in used)
        completed = sum(w.completed for w in used)
        return cls(
            windows=len(used),
            duration_s=duration,
            completed=completed,
            errors=sum(w.count(Kind.ERROR) for w in used),
            drops=sum(w.count(Kind.DROP) for w in used),
            throughput=completed / duration if duration > 0 else 0.0,
            latency_ms=Percentiles.of([v for w in used for v in w.latencies_s]).scaled(1e3),
            server_ms=Percentiles.of([v for w in used for v in w.server_us]).scaled(1e-3),
        )
