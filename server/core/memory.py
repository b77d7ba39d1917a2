"""Memory budgets: the daemon's (--max-memory) and each session's (--max-session-memory).

The daemon-wide budget counts the buffers of incoming frames: a frame reserves its whole size when
its header arrives, before a byte is written, and gives it back when the buffers are freed (frame
run, stream ended, client gone), so stalled half-sent frames cannot add up past the budget. A
session's budget bounds what its model may materialize (checked before load, and enforced as an
address-space limit on a worker process with --isolation process).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import numpy as np

from rknn_server.errors import ResourceExhausted


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
