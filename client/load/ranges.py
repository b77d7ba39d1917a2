"""Sweep ranges as perf_analyzer writes them (`START:END[:STEP]`), parsed as argparse types so a bad
range is refused with the option's name, what was wrong and what was expected."""

from __future__ import annotations

import argparse
import math

# More steps than this is a typo (1:1000 for 1:10), not a plan: each step takes several windows.
MAX_STEPS = 100
# Each unit of concurrency is a session and a thread on this PC; the daemon refuses far fewer anyway.
MAX_CONCURRENCY = 256


def _number(part: str, what: str, text: str, integer: bool) -> float:
    kind = "a whole number" if integer else "a number"
    try:
        value = int(part) if integer else float(part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {part!r} in {text!r} is not {kind}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{what} in {text!r} must be a finite number above 0, not {part}")
    return value


def parse_range(text: str, *, integer: bool, example: str) -> list[float]:
    """The values START, START+STEP, ... up to END inclusive (STEP defaults to 1)."""
    expected = f"expected START:END or START:END:STEP, e.g. {example}"
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"{text!r} is not a range; {expected}")
    start = _number(parts[0], "START", text, integer)
    end = _number(parts[1], "END", text, integer)
    step = _number(parts[2], "STEP", text, integer) if len(parts) == 3 else 1
    if end < start:
        raise argparse.ArgumentTypeError(
            f"END ({parts[1]}) is below START ({parts[0]}) in {text!r}; {expected}"
        )
    # A hair of slack so 0.1:0.3:0.1 reaches 0.3 despite binary fractions.
    count = math.floor((end - start) / step + 1e-9) + 1
    if count > MAX_STEPS:
        raise argparse.ArgumentTypeError(
            f"{text!r} makes {count} steps; at most {MAX_STEPS} (a larger STEP, or a narrower range)"
        )
    return [start + i * step for i in range(count)]


def _concurrency_cap(values: list[int], text: str) -> list[int]:
    if values[-1] > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(
            f"concurrency {values[-1]} in {text!r} is above {MAX_CONCURRENCY} (one session and thread each)"
        )
    return values


def concurrency(text: str) -> list[int]:
    """argparse type of `--concurrency N`: one step."""
    return _concurrency_cap([int(_number(text, "N", text, integer=True))], text)


def concurrency_range(text: str) -> list[int]:
    """argparse type of `--concurrency-range START:END[:STEP]` (whole numbers from 1)."""
    values = [int(v) for v in parse_range(text, integer=True, example="1:8 or 1:16:2")]
    return _concurrency_cap(values, text)


def rate_range(text: str) -> list[float]:
    """argparse type of `--request-rate-range START:END[:STEP]` (requests per second, above 0)."""
    return parse_range(text, integer=False, example="10:50:10 or 0.5:2:0.5")


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1."""
    return int(_number(text, "the value", text, integer=True))


def positive_float(text: str) -> float:
    return _number(text, "the value", text, integer=False)
