"""Block writes to a partial upload file: the views given, in order, from a thread of their own,
with at most DEPTH in flight."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from rknn_server.store import block_writer
from rknn_server.store.block_writer import DEPTH, BlockWriter, WriteQueue

PART = 4096 + 17  # sizes that are no multiple of a page land as well


def _write(path: Path, blocks: list[list[bytes | memoryview]], start: int = 0) -> None:
    queue = WriteQueue()
    writer = BlockWriter(path, start, queue)
    try:
        for parts in blocks:
            writer.write(parts)
    finally:
        writer.close()
        queue.close()


def test_blocks_of_views_land_in_order(tmp_path: Path) -> None:
    data = os.urandom(5 * PART + 1234)
    view = memoryview(data)
    blocks: list[list[bytes | memoryview]] = [
        [view[:PART], view[PART : 3 * PART]],
        [data[3 * PART : 4 * PART + 17]],
        [view[4 * PART + 17 :]],
    ]
    _write(tmp_path / "f", blocks)
    assert (tmp_path / "f").read_bytes() == data


def test_a_resume_from_held_bytes_appends_after_them(tmp_path: Path) -> None:
    held, more = os.urandom(PART), os.urandom(3 * PART + 5)
    (tmp_path / "f").write_bytes(held)
    _write(tmp_path / "f", [[more[: 2 * PART]], [more[2 * PART :]]], start=len(held))
    assert (tmp_path / "f").read_bytes() == held + more


def test_writes_run_beside_the_caller_with_at_most_depth_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller goes on (to hash the block) while it is written; the write after DEPTH in flight
    waits for the disk, so an upload's buffers stay bounded however slow the disk."""
    release = threading.Event()
    real = os.pwritev

    def slow_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        assert release.wait(30)
        return real(fd, buffers, offset)

    monkeypatch.setattr(block_writer.os, "pwritev", slow_pwritev)
    data = os.urandom((DEPTH + 1) * PART)
    queue = WriteQueue()
    writer = BlockWriter(tmp_path / "f", 0, queue)
    for i in range(DEPTH):  # the disk has not written any: these return at once
        writer.write([data[i * PART : (i + 1) * PART]])
    blocked = threading.Thread(target=writer.write, args=([data[DEPTH * PART :]],))
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive()  # DEPTH writes in flight: the next one waits
    release.set()
    blocked.join(30)
    assert not blocked.is_alive()
    writer.close()
    queue.close()
    assert (tmp_path / "f").read_bytes() == data


def test_a_write_failing_in_the_write_thread_is_raised_to_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, buffers: list[memoryview], offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(block_writer.os, "pwritev", full)
    queue = WriteQueue()
    writer = BlockWriter(tmp_path / "f", 0, queue)
    writer.write([os.urandom(PART)])  # queued: the error comes later
    with pytest.raises(OSError) as raised:
        writer.close()
    assert raised.value.errno == errno.ENOSPC
    queue.close()
