"""Appending to files in large blocks from a thread of their own, bypassing the page cache where the
filesystem allows it.

Copying a received block into the page cache costs about as much CPU as receiving it (measured here:
most of the daemon's CPU during an upload was the kernel's side of `write`). With O_DIRECT each block
is copied once into a page-aligned buffer and the disk reads it from there. A block whose size is not
a multiple of `ALIGN` has its tail written the ordinary way, and the file continues that way; a
filesystem without O_DIRECT (tmpfs) gets ordinary writes throughout. Every write names its offset,
so a direct write refused halfway is simply written again the ordinary way.

A direct write waits for the disk, so the writes of an upload run in a thread of their own
(`WriteQueue`): the caller hashes a block while it is written and the next block is received
meanwhile. At most `DEPTH` writes are in flight, each holding its own buffer.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ALIGN = 4096  # the largest logical block size in use: a multiple of every device's
DEPTH = 2  # writes in flight per upload: one on its way to the disk while the next is hashed
_IOV_PARTS = 1024  # pwritev takes at most IOV_MAX buffers per call

Buffers = Sequence[bytes | memoryview]


def pwrite_all(fd: int, buffers: Buffers, offset: int) -> int:
    """Write every buffer, in order, from `offset`, in as few calls as the kernel allows; returns the size."""
    views = [memoryview(b) for b in buffers]
    first, done = 0, 0
    while first < len(views):
        written = os.pwritev(fd, views[first : first + _IOV_PARTS], offset + done)
        done += written
        while first < len(views) and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:
            views[first] = views[first][written:]
    return done


class _Slot:
    """One write in flight and the page-aligned buffer it writes from, kept for the next write."""

    def __init__(self) -> None:
        self.pending: Future[Any] | None = None
        self._map: mmap.mmap | None = None

    def buffer(self, size: int) -> mmap.mmap:
        if self._map is None or len(self._map) < size:
            self._map = mmap.mmap(-1, max(ALIGN, -(-size // ALIGN) * ALIGN))
        return self._map

    def wait(self) -> None:
        """Wait for the write in flight, raising its error."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def release(self) -> None:
        self._map = None  # unmapped once no view of it is left (an exception may still hold one)


class WriteQueue:
    """The disk side of one upload: its writes, done in order by one thread while the caller goes on."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._slots = [_Slot() for _ in range(DEPTH)]
        self._turn = 0

    def slot(self) -> _Slot:
        """The next slot, once the write it last carried is done (raising that write's error)."""
        slot = self._slots[self._turn]
        self._turn = (self._turn + 1) % DEPTH
        slot.wait()
        return slot

    def submit(self, slot: _Slot, fn: Callable[..., Any], *args: Any) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="upload-write")
        slot.pending = self._thread.submit(fn, *args)

    def drain(self) -> None:
        """Wait for every write in flight; raises the first error after all are done."""
        error: Exception | None = None
        for slot in self._slots:
            try:
                slot.wait()
            except Exception as exc:  # raised below, once nothing is in flight
                error = error or exc
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the writes in flight (their errors are dropped: the caller gave up on them) and
        release the thread and the buffers."""
        for slot in self._slots:
            with contextlib.suppress(OSError):
                slot.wait()
            slot.release()
        if self._thread is not None:
            self._thread.shutdown()
            self._thread = None


class BlockWriter:
    """One file being appended to through an upload's `WriteQueue`, from `start` (the bytes already held)."""

    def __init__(self, path: Path, start: int, queue: WriteQueue) -> None:
        self._pos = start
        self._queue = queue
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._direct: int | None = None
        self._refused = False  # set by the write thread when the filesystem refuses a direct write
        self._direct_ended = start % ALIGN != 0  # the file no longer ends on an aligned offset
        if not self._direct_ended and hasattr(os, "O_DIRECT"):
            try:
                self._direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError:
                self._direct = None

    def write(self, parts: Buffers) -> Buffers:
        """Queue `parts` to be appended. Returns buffers holding the same bytes, which the caller may
        read (to hash them) while they are written, up to its next call."""
        total = sum(len(p) for p in parts)
        slot = self._queue.slot()
        pos, self._pos = self._pos, self._pos + total
        if self._direct is None or self._refused or self._direct_ended:
            self._queue.submit(slot, pwrite_all, self._fd, parts, pos)
            return parts
        buffer = slot.buffer(total)
        at = 0
        for part in parts:
            buffer[at : at + len(part)] = part
            at += len(part)
        self._direct_ended = total % ALIGN != 0
        self._queue.submit(slot, self._write_direct, self._direct, memoryview(buffer)[:total], pos)
        return [memoryview(buffer)[:total]]

    def _write_direct(self, direct: int, view: memoryview, pos: int) -> None:
        """In the write thread: the aligned part directly, the rest (or all, if refused) the ordinary way."""
        aligned = len(view) - len(view) % ALIGN
        try:
            if aligned:
                pwrite_all(direct, [view[:aligned]], pos)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this filesystem or device refuses direct I/O
                raise
            self._refused = True
            aligned = 0
        if len(view) > aligned:
            pwrite_all(self._fd, [view[aligned:]], pos + aligned)

    def close(self) -> None:
        """Wait for this upload's writes in flight (raising their error), then close the file."""
        try:
            self._queue.drain()
        finally:
            if self._direct is not None:
                os.close(self._direct)
                self._direct = None
            os.close(self._fd)
