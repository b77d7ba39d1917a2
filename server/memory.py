"""Memory budgets: the daemon's (--max-memory) and each session's (--max-session-memory).

The daemon-wide budget counts the buffers of incoming frames: a frame reserves its whole size when
its header arrives, before a byte is written, and gives it back when the buffers are freed (frame
run, stream ended, client gone), so stalled half-sent frames cannot add up past the budget. A
session's budget bounds what its model may materialize (checked before load, and enforced as an
address-space limit on a worker process with --isolation process).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rknn_server.errors import ResourceExhausted

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size written as bytes ("1048576") or with a unit ("512MiB", "2GiB", "1.5GB", "64k")."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a size; expected bytes or a number with a unit, e.g. 512MiB or 2GiB"
        )
    number, unit, binary = match.groups()
    unit = (unit or "").lower()
    scale = 1024 ** ("kmgt".index(unit) + 1) if unit and binary else _UNITS[unit]
    return int(float(number) * scale)


def format_size(size: int) -> str:
    """A byte count as people read it and parse_size takes back: `16 GiB`, `7.75 GiB`, `512 B`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.4g} {unit}"
        value /= 1024
    return f"{value:.4g} TiB"


def machine_ram() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class MemoryLimits:
    """The budgets, 0 meaning unlimited. Defaults: half the RAM for the daemon, a quarter per session."""

    max_memory: int = 0
    max_session_memory: int = 0

    @classmethod
    def for_machine(cls, ram: int | None = None) -> MemoryLimits:
        ram = machine_ram() if ram is None else ram
        return cls(max_memory=ram // 2, max_session_memory=ram // 4)


class MemoryBudget:
    """Bytes reserved against a limit, each reservation tied to the buffers it pays for."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()  # buffers may be freed on any thread

    def hold(self, buffers: Sequence[np.ndarray], what: str) -> None:
        """Reserve the buffers' bytes (raises ResourceExhausted naming the budget when they do not
        fit); they are given back when each buffer is freed."""
        size = sum(b.nbytes for b in buffers)
        with self._lock:
            if self.limit and self.used + size > self.limit:
                raise ResourceExhausted(
                    f"{what} need {size} bytes, and the daemon already holds {self.used} bytes of "
                    f"incoming data, the limit max_memory={self.limit} (--max-memory); retry later or "
                    "send smaller tensors"
                )
            self.used += size
        for buffer in buffers:
            weakref.finalize(buffer, self._release, buffer.nbytes)

    def _release(self, size: int) -> None:
        with self._lock:
            self.used -= size
