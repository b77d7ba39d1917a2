"""Two ways of doing one thing, timed alternately so both see the same machine noise."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def side_by_side(
    local: Callable[[], object], remote: Callable[[], object], runs: int, warm: int
) -> tuple[float, float]:
    """The p50 of each, in seconds, over `runs` alternated calls after `warm` of each."""
    for _ in range(warm):
        local()
        remote()
    local_s, remote_s = [], []
    for _ in range(runs):
        start = time.perf_counter()
        local()
        local_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        remote()
        remote_s.append(time.perf_counter() - start)
    return statistics.median(local_s), statistics.median(remote_s)
