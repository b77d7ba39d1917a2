"""Appending to a file in large blocks, bypassing the page cache where the filesystem allows it.

Copying a received block into the page cache costs about as much CPU as receiving it (measured here:
most of the daemon's CPU during an upload was the kernel's side of `write`). With O_DIRECT each block
is copied once into an aligned buffer and the disk reads it from there. A block whose size is not a
multiple of `ALIGN` has its tail written the ordinary way, and the file continues that way; a
filesystem without O_DIRECT (tmpfs) gets ordinary writes throughout. Every write names its offset,
so a direct write refused halfway is simply written again the ordinary way.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

ALIGN = 4096  # the largest logical block size in use: a multiple of every device's
_IOV_PARTS = 1024  # pwritev takes at most IOV_MAX buffers per call


def pwrite_all(fd: int, buffers: list[bytes] | list[memoryview], offset: int) -> int:
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


class AlignedBuffer:
    """One page-aligned buffer shared by the writers of an upload (they write one block at a time), so
    that memory stays at one block however many files are in progress."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def get(self, size: int) -> mmap.mmap:
        if self._map is None or len(self._map) < size:
            self._map = mmap.mmap(-1, max(ALIGN, -(-size // ALIGN) * ALIGN))
        return self._map

    def release(self) -> None:
        self._map = None  # unmapped once no view of it is left (an exception may still hold one)


class BlockWriter:
    """One file being appended to, from `start` (the bytes already held)."""

    def __init__(self, path: Path, start: int, buffer: AlignedBuffer) -> None:
        self._pos = start
        self._buffer = buffer
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._direct: int | None = None
        if start % ALIGN == 0 and hasattr(os, "O_DIRECT"):
            try:
                self._direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError:
                self._direct = None

    def write(self, parts: list[bytes]) -> None:
        if self._direct is None:
            self._pos += pwrite_all(self._fd, parts, self._pos)
            return
        total = sum(len(p) for p in parts)
        buffer = self._buffer.get(total)
        at = 0
        for part in parts:
            buffer[at : at + len(part)] = part
            at += len(part)
        aligned = total - total % ALIGN
        with memoryview(buffer) as view:
            try:
                if aligned:
                    pwrite_all(self._direct, [view[:aligned]], self._pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: this filesystem or device refuses direct I/O
                    raise
                aligned = 0
            if total > aligned:
                pwrite_all(self._fd, [view[aligned:total]], self._pos + aligned)
        if total > aligned:  # refused, or the file no longer ends on an aligned offset
            self._end_direct()
        self._pos += total

    def _end_direct(self) -> None:
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None

    def close(self) -> None:
        self._end_direct()
        os.close(self._fd)
