"""Pinning CPU, NPU and DDR to their highest frequency for a measurement (eval_perf fix_freq).

Each cpufreq policy and NPU/DDR devfreq device gets the `performance` governor and min = max =
its highest available frequency; the previous values are written back afterwards, also when the
measurement raises. Without permission (or without the sysfs files) nothing stays changed and the
outcome says why, so the measurement still runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rknn_server.board.platform import cpufreq_policies, devfreq_devices, read_frequencies
from rknn_server.runtime.base import FrequencyOutcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Knob:
    """One frequency domain's sysfs files."""

    governor: Path
    available_governors: Path
    available_freqs: Path
    hardware_max: Path
    min_freq: Path
    max_freq: Path


def _cpu_knob(policy: Path) -> _Knob:
    return _Knob(
        governor=policy / "scaling_governor",
        available_governors=policy / "scaling_available_governors",
        available_freqs=policy / "scaling_available_frequencies",
        hardware_max=policy / "cpuinfo_max_freq",
        min_freq=policy / "scaling_min_freq",
        max_freq=policy / "scaling_max_freq",
    )


def _devfreq_knob(device: Path) -> _Knob:
    return _Knob(
        governor=device / "governor",
        available_governors=device / "available_governors",
        available_freqs=device / "available_frequencies",
        hardware_max=device / "max_freq",
        min_freq=device / "min_freq",
        max_freq=device / "max_freq",
    )


def _knobs(root: Path) -> list[_Knob]:
    knobs = [_cpu_knob(policy) for policy in cpufreq_policies(root)]
    for kind in ("NPU", "DDR"):
        knobs.extend(_devfreq_knob(device) for device in devfreq_devices(root, kind))
    return [knob for knob in knobs if knob.min_freq.exists() and knob.max_freq.exists()]


def _highest(knob: _Knob) -> str | None:
    source = knob.available_freqs if knob.available_freqs.exists() else knob.hardware_max
    values = [int(word) for word in source.read_text().split() if word.isdigit()]
    return str(max(values)) if values else None


def _plan(knob: _Knob) -> list[tuple[Path, str]]:
    """The writes that pin one domain: governor first, then max before min (min may not exceed max)."""
    top = _highest(knob)
    if top is None:
        return []
    writes: list[tuple[Path, str]] = []
    governors = knob.available_governors.read_text().split() if knob.available_governors.exists() else []
    if knob.governor.exists() and "performance" in governors:
        writes.append((knob.governor, "performance"))
    writes += [(knob.max_freq, top), (knob.min_freq, top)]
    return writes


class _Writer:
    """Writes sysfs values and remembers what was there, to put it back in reverse order."""

    def __init__(self) -> None:
        self._saved: list[tuple[Path, str]] = []

    def write(self, path: Path, value: str) -> None:
        previous = path.read_text().strip()
        path.write_text(value)
        self._saved.append((path, previous))

    def restore(self) -> None:
        while self._saved:
            path, value = self._saved.pop()
            try:
                path.write_text(value)
            except OSError as exc:
                log.warning("could not restore %s to %s: %s", path, value, exc)


@contextmanager
def pinned_frequencies(root: Path) -> Iterator[FrequencyOutcome]:
    """Pin for the duration of the block; the yielded outcome (filled in on entry: the readings are
    taken while pinned) says whether it worked."""
    outcome = FrequencyOutcome()
    writer = _Writer()
    try:
        knobs = _knobs(root)
        for knob in knobs:
            for path, value in _plan(knob):
                writer.write(path, value)
        outcome.fixed = bool(knobs)
        outcome.note = "" if knobs else "frequencies not fixed: no cpufreq/devfreq controls found"
    except OSError as exc:
        writer.restore()
        reason = exc.strerror or str(exc)
        outcome.note = f"frequencies not fixed: cannot write {exc.filename or 'sysfs'}: {reason}"
    outcome.frequencies = read_frequencies(root)
    try:
        yield outcome
    finally:
        writer.restore()
