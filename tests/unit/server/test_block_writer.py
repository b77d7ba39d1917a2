"""Block writes to a partial upload file: direct where the filesystem allows, ordinary otherwise, and
the same bytes on disk either way."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from rknn_server import block_writer
from rknn_server.block_writer import ALIGN, DEPTH, BlockWriter, WriteQueue


def _write(path: Path, blocks: list[list[bytes]], start: int = 0) -> None:
    queue = WriteQueue()
    writer = BlockWriter(path, start, queue)
    try:
        for parts in blocks:
            writer.write(parts)
    finally:
        writer.close()
        queue.close()


def test_aligned_blocks_then_an_unaligned_tail_land_in_order(tmp_path: Path) -> None:
    data = os.urandom(5 * ALIGN + 1234)
    blocks = [
        [data[:ALIGN], data[ALIGN : 3 * ALIGN]],
        [data[3 * ALIGN : 4 * ALIGN + 17]],
        [data[4 * ALIGN + 17 :]],
    ]
    _write(tmp_path / "f", blocks)
    assert (tmp_path / "f").read_bytes() == data


def test_a_resume_from_held_bytes_appends_after_them(tmp_path: Path) -> None:
    held, more = os.urandom(ALIGN), os.urandom(3 * ALIGN + 5)
    (tmp_path / "f").write_bytes(held)
    _write(tmp_path / "f", [[more[: 2 * ALIGN]], [more[2 * ALIGN :]]], start=len(held))
    assert (tmp_path / "f").read_bytes() == held + more


def test_a_filesystem_refusing_direct_writes_gets_ordinary_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused: list[int] = []
    real = os.pwritev

    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        if fd in direct_fds:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset)

    direct_fds: set[int] = set()
    real_open = os.open

    def open_(path: str, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if flags & getattr(os, "O_DIRECT", 0):
            direct_fds.add(fd)
        return fd

    monkeypatch.setattr(block_writer.os, "pwritev", pwritev)
    monkeypatch.setattr(block_writer.os, "open", open_)
    data = os.urandom(4 * ALIGN)
    _write(tmp_path / "f", [[data[: 2 * ALIGN]], [data[2 * ALIGN :]]])
    assert (tmp_path / "f").read_bytes() == data
    assert len(refused) == (1 if direct_fds else 0)  # refused once, then ordinary writes throughout


def test_writes_run_beside_the_caller_with_at_most_depth_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller gets each block back to hash while it is written; the one after DEPTH blocks in
    flight waits for the disk, so an upload's buffers stay bounded however slow the disk."""
    release = threading.Event()
    real = os.pwritev

    def slow_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        assert release.wait(30)
        return real(fd, buffers, offset)

    monkeypatch.setattr(block_writer.os, "pwritev", slow_pwritev)
    data = os.urandom((DEPTH + 1) * ALIGN)
    queue = WriteQueue()
    writer = BlockWriter(tmp_path / "f", 0, queue)
    returned: list[bytes] = []
    for i in range(DEPTH):  # the disk has not written any: these return at once, their bytes readable
        returned.append(b"".join(bytes(b) for b in writer.write([data[i * ALIGN : (i + 1) * ALIGN]])))
    blocked = threading.Thread(target=writer.write, args=([data[DEPTH * ALIGN :]],))
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive()  # DEPTH writes in flight: the next one waits
    release.set()
    blocked.join(30)
    assert not blocked.is_alive()
    writer.close()
    queue.close()
    assert b"".join(returned) == data[: DEPTH * ALIGN]
    assert (tmp_path / "f").read_bytes() == data


def test_a_write_failing_in_the_write_thread_is_raised_to_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, buffers: list[memoryview], offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(block_writer.os, "pwritev", full)
    queue = WriteQueue()
    writer = BlockWriter(tmp_path / "f", 0, queue)
    writer.write([os.urandom(ALIGN)])  # queued: the error comes later
    with pytest.raises(OSError) as raised:
        writer.close()
    assert raised.value.errno == errno.ENOSPC
    queue.close()
