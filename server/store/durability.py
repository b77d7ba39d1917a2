"""Committed models made durable in the background: their files synced to the disk, then their
verification record written.

An upload is hashed as it arrives and written through the page cache; syncing its files before
answering made every upload as slow as the disk's own writes (measured here: 2-4 s per GiB of
fsync against about 1.3 s for the transfer). So the cache answers once a model verified and is in
place, and this thread of the cache's syncs it afterwards, one model at a time, in order: the files,
the marker, the folder, and only then the record (`cache_records`), which a restarted daemon trusts
instead of hashing. A power cut before the record leaves a model that its next open hashes again
(and removes if the cut tore it), never one trusted unseen; until the record is written the cache
trusts, in memory, the stamps it took when it verified the model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


def sync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's sync makes the renames into it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Syncer:
    """The cache's one background thread for making models durable, started when first needed."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None

    def submit(self, job: Callable[[], Any]) -> Future[Any]:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="cache-sync")
        return self._thread.submit(job)

    def close(self) -> None:
        """Finish the models queued (a clean stop leaves every one durable and recorded)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
