"""Pinning CPU/NPU/DDR clocks to their highest frequency for a measurement (eval_perf's fix_freq).

Each domain's limits are raised to its highest available frequency (max first, then min, so the kernel
never sees min > max) and its governor set to "performance" where offered. Every write is recorded with
the value it replaced and undone in reverse order on exit, also when the measurement raises. Without
permission nothing stays changed: the report says the frequencies were not fixed, and why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rknn_server.platform import FreqDomain, frequency_domains, read_int, read_text

log = logging.getLogger(__name__)


@dataclass
class PinReport:
    fixed: bool = False
    reason: str = ""
    pinned: list[str] = field(default_factory=list)  # e.g. "CPU policy4 -> 2256000"


def highest_frequency(domain: FreqDomain) -> int | None:
    listed = [int(v) for v in (read_text(domain.file("available")) or "").split() if v.isdigit()]
    return max(listed) if listed else read_int(domain.file("hw_max"))


class _Journal:
    """Writes sysfs files, remembering what each held so they can be put back in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[Path, str]] = []

    def write(self, path: Path, value: str) -> None:
        previous = read_text(path)
        if previous is None:
            raise PermissionError(f"cannot read {path}")
        if previous == value:
            return
        path.write_text(value)
        self._undo.append((path, previous))

    def restore(self) -> list[str]:
        """Undo every write; returns the files that could not be restored."""
        failed = []
        while self._undo:
            path, previous = self._undo.pop()
            try:
                path.write_text(previous)
            except OSError as exc:
                log.warning("cannot restore %s to %r: %s", path, previous, exc)
                failed.append(str(path))
        return failed


def _pin(journal: _Journal, domain: FreqDomain, top: int) -> None:
    journal.write(domain.file("max"), str(top))
    journal.write(domain.file("min"), str(top))
    if "performance" in (read_text(domain.file("governors")) or "").split():
        journal.write(domain.file("governor"), "performance")


@contextmanager
def pinned_frequencies(root: Path) -> Iterator[PinReport]:
    """Hold every clock under root at its highest frequency inside the block, then restore them."""
    report = PinReport()
    journal = _Journal()
    targets = [(d, top) for d in frequency_domains(root) if (top := highest_frequency(d)) is not None]
    if not targets:
        report.reason = f"no cpufreq/devfreq controls found under {root}"
    else:
        try:
            for domain, top in targets:
                _pin(journal, domain, top)
                report.pinned.append(f"{domain.kind} {domain.path.name} -> {top}")
            report.fixed = True
        except OSError as exc:
            journal.restore()
            report.pinned.clear()
            report.reason = f"frequencies were not fixed: {exc}"
    if not report.fixed:
        log.info("%s", report.reason)
    try:
        yield report
    finally:
        journal.restore()
