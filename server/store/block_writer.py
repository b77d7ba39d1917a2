"""Appending an upload's received bytes to its files from a thread of their own, as they are.

The caller hands over the views of what gRPC received and hashes those same views while they are
written: no copy in Python (the kernel's copy into the page cache is the only one). O_DIRECT, used
before, needed each block copied into a page-aligned buffer first and made every upload wait for the
disk's own write speed (measured here: 2-4 s per GiB against about 1.3 s for the transfer); the
model cache makes a committed model durable in the background instead (`rknn_server.store.durability`).

The writes of an upload run in order in one thread (`WriteQueue`), so a disk that throttles its
writers holds up neither the hashing nor the receiving; at most `DEPTH` writes are in flight, each
holding its block's views, so an upload's memory stays bounded however slow the disk.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


class WriteQueue:
    """The disk side of one upload: its writes, done in order by one thread while the caller goes on."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._pending: deque[Future[Any]] = deque()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue a write once fewer than `DEPTH` are in flight (raising the error of one that failed)."""
        while len(self._pending) >= DEPTH:
            self._pending.popleft().result()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="upload-write")
        self._pending.append(self._thread.submit(fn, *args))

    def drain(self) -> None:
        """Wait for every write in flight; raises the first error after all are done."""
        error: Exception | None = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except Exception as exc:  # raised below, once nothing is in flight
                error = error or exc
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the writes in flight (their errors are dropped: the caller gave up on them) and
        release the thread."""
        while self._pending:
            with contextlib.suppress(OSError):
                self._pending.popleft().result()
        if self._thread is not None:
            self._thread.shutdown()
            self._thread = None


class BlockWriter:
    """One file being appended to through an upload's `WriteQueue`, from `start` (the bytes already held)."""

    def __init__(self, path: Path, start: int, queue: WriteQueue) -> None:
        self._pos = start
        self._queue = queue
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)

    def write(self, parts: Buffers) -> None:
        """Queue `parts` to be appended; the caller may read them (to hash them) while they are written."""
        pos, self._pos = self._pos, self._pos + sum(len(p) for p in parts)
        self._queue.submit(pwrite_all, self._fd, parts, pos)

    def close(self) -> None:
        """Wait for this upload's writes in flight (raising their error), then close the file."""
        try:
            self._queue.drain()
        finally:
            os.close(self._fd)
