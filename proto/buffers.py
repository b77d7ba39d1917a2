"""Tensor buffers that are used again once every array over them has been freed.

A large array is fresh memory each time, and the kernel zeroes every fresh page before a byte is
copied in (measured here in a 64 MiB round trip: a sixth of the client's CPU for its outputs, and on
the daemon about as much as a copy for each of a frame's inputs and outputs). The memory of a tensor
nobody holds any more can take the next frame's bytes instead: the client's outputs, the daemon's
frame inputs and its host runtime's outputs come from a pool of their session's. Each buffer goes out
behind a lease, a small object whose memory is the buffer's and over which the arrays are made, so
every array and view of it keeps the lease alive: only when the last of them is freed does the buffer
come back (a finalizer), never while anyone can still read it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref

import numpy as np

# Below this, malloc's own free lists already serve a buffer again without fresh pages.
MIN_POOLED_BYTES = 1 << 20
# What a pool keeps of buffers nobody holds: a frame or two of a large model's tensors. The memory
# stays with the session (the daemon's idle sessions are reaped) instead of going back at once.
KEEP_BYTES = 128 << 20
# What all the pools of a process keep together, however many sessions it has: the daemon's memory
# held between frames stays bounded (16 sessions would otherwise keep 16 x KEEP_BYTES of each kind).
KEEP_TOTAL_BYTES = 256 << 20


class KeptBytes:
    """The bytes all pools keep, against KEEP_TOTAL_BYTES."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._lock = threading.Lock()

    def claim(self, nbytes: int) -> bool:
        with self._lock:
            if self.bytes + nbytes > self.limit:
                return False
            self.bytes += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.bytes -= nbytes

    def forget(self, spare: dict[int, list[np.ndarray]]) -> None:
        """A pool went away with these spares."""
        self.give(sum(size * len(stores) for size, stores in spare.items()))


KEPT = KeptBytes(KEEP_TOTAL_BYTES)


@functools.lru_cache(maxsize=64)
def _lease_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    """A bytes-sized ctypes array type that can be watched (a subclass takes weak references)."""
    return type(f"Lease{nbytes}", (ctypes.c_char * nbytes,), {})


class BufferPool:
    """Byte buffers for one session's tensors: one that came back is used again for the same size.

    Keeps at most `keep_bytes` of buffers nobody holds (a session's tensors take the same sizes
    frame after frame; a few frames in flight need a few of each), and only while all the pools of
    the process keep less than `kept`'s limit; the rest go back to the system."""

    def __init__(self, keep_bytes: int = KEEP_BYTES, kept: KeptBytes = KEPT) -> None:
        self._keep_bytes = keep_bytes
        self._kept = kept
        self._spare: dict[int, list[np.ndarray]] = {}
        self._spare_bytes = 0
        weakref.finalize(self, kept.forget, self._spare)
        # Buffers come back on whichever thread frees the last array, even inside this lock (a
        # garbage collection that an allocation sets off): reentrant.
        self._lock = threading.RLock()

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of `nbytes` (its bytes whatever they were)."""
        if nbytes < MIN_POOLED_BYTES:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            spares = self._spare.get(nbytes)
            store = spares.pop() if spares else None
            if store is not None:
                self._spare_bytes -= nbytes
                self._kept.give(nbytes)
        if store is None:
            store = np.empty(nbytes, np.uint8)
        lease = _lease_type(nbytes).from_buffer(store.data)
        weakref.finalize(lease, self._give_back, store)
        return np.frombuffer(memoryview(lease), np.uint8)

    def _give_back(self, store: np.ndarray) -> None:
        with self._lock:
            if self._spare_bytes + store.nbytes <= self._keep_bytes and self._kept.claim(store.nbytes):
                self._spare.setdefault(store.nbytes, []).append(store)
                self._spare_bytes += store.nbytes
