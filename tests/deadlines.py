"""Checking from a test's clock that a daemon waited out one of its deadlines.

The daemon runs on uvloop, whose timers count on libuv's millisecond clock, read once at the start of
each loop turn: a 1 s deadline can fire up to a millisecond before 1 s has passed on `time.monotonic()`
(CI saw 0.9998 s). A deadline is therefore held to within `EARLY_S` below it, never to the nanosecond.
"""

from __future__ import annotations

import time

EARLY_S = 0.01  # ten of libuv's clock ticks: more than a timer can fire early, far less than any deadline


def assert_waited(started: float, deadline_s: float, most_s: float) -> None:
    """The time since `started` (a `time.monotonic()` taken before the peer went silent) is the
    deadline, less a timer's granularity, and under `most_s` (the daemon did close it, in time)."""
    waited = time.monotonic() - started
    assert deadline_s - EARLY_S <= waited < most_s, (
        f"closed after {waited:.4f} s; the deadline is {deadline_s:g} s (and at most {most_s:g} s)"
    )
