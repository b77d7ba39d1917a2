"""Block writes to a partial upload file: direct where the filesystem allows, ordinary otherwise, and
the same bytes on disk either way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rknn_server import block_writer
from rknn_server.block_writer import ALIGN, BlockWriter, WriteQueue


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
