"""The one rule for replies too large to send, whichever door they leave by (rknn.v1's Run, v2 gRPC,
v2 REST).

A reply is held to the most one message of its door carries (--max-message-bytes for v2, the
protobuf limit for Run) and, where the door says so, to the daemon's memory budget. Its size is its
encoding's: raw bytes (each element its itemsize), or JSON text (up to a datatype's
`JSON_ELEMENT_BYTES` per element, many times the bytes). Where the model declares its outputs'
shapes the rule is applied before compute, so that nothing runs whose answer cannot be sent; an
output of unknown size is checked once it exists, before a byte of its reply is encoded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rknn_server.core.memory import MemoryBudget
from rknn_server.errors import ResourceExhausted

HEADROOM_BYTES = 64 << 10  # a reply's names, shapes and framing besides its tensors


class ReplyTooLarge(ResourceExhausted):
    """A reply that no retry makes fit: the client asks for fewer outputs, another encoding or door."""


@dataclass(frozen=True)
class Sized:
    """One output as a reply carries it: its shape (a negative dimension: unknown until the run),
    its bytes per element, and what its encoding takes per element when that is not the bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    itemsize: int
    encoded: int = 0  # at most this many bytes per element as JSON; 0: raw, its itemsize

    @property
    def known(self) -> bool:
        return min(self.shape, default=0) >= 0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize if self.known else 0

    @property
    def size(self) -> int:
        """Its bytes in the reply (0 while unknown)."""
        return math.prod(self.shape) * (self.encoded or self.itemsize) if self.known else 0

    def describe(self) -> str:
        how = f", up to {self.size} as JSON" if self.encoded else ""
        return f"output {self.name!r} ({self.datatype} {list(self.shape)}: {self.nbytes} bytes{how})"


@dataclass(frozen=True)
class ReplyRule:
    """What one door's replies may come to, and what to tell a client whose reply does not fit."""

    door: str  # "Run message", "v2 gRPC reply", "REST reply"
    max_bytes: int
    setting: str  # where max_bytes comes from, for the message
    advice: str
    budget: MemoryBudget | None = None
    headroom: int = HEADROOM_BYTES

    @property
    def most(self) -> int:
        """The most bytes of tensors one reply carries."""
        return self.max_bytes - self.headroom

    def check(self, outputs: Sequence[Sized], extra: int = 0) -> None:
        """Refuse a reply whose outputs (those of known size; the rest count once they exist) and
        `extra` bytes (an echoed id) do not fit; ReplyTooLarge naming the largest output."""
        known = [o for o in outputs if o.known]
        size = sum([o.size for o in known]) + extra
        if size <= self._limit()[0]:  # the common case: nothing to describe
            return
        largest = max(known, key=lambda o: o.size, default=None)
        detail = ""
        if largest is not None:
            detail = f" ({'the largest: ' if len(known) > 1 else ''}{largest.describe()})"
        self.check_bytes(size, detail)

    def check_bytes(self, size: int, detail: str = "") -> None:
        """Refuse a reply of `size` bytes of tensors over the door's limit or the memory budget."""
        most, setting = self._limit()
        if size > most:
            raise ReplyTooLarge(
                f"the outputs are {size} bytes{detail}, too large for one {self.door} (at most {most}: "
                f"{setting}); {self.advice}"
            )

    def _limit(self) -> tuple[int, str]:
        """The most bytes of tensors a reply may have now, and the setting that says so."""
        if self.budget is not None and 0 < self.budget.limit < self.most:
            return self.budget.limit, f"the memory budget, --max-memory {self.budget.limit}"
        return self.most, self.setting


__all__ = ["HEADROOM_BYTES", "ReplyRule", "ReplyTooLarge", "Sized"]
