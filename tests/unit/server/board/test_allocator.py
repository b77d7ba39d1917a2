"""The allocator settings take on 64-bit glibc (the daemon's boards and hosts) and change nothing else."""

from __future__ import annotations

import platform
import struct

import pytest

from rknn_server.board.allocator import reuse_large_buffers


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or struct.calcsize("P") != 8,
    reason="the thresholds are glibc's, 64-bit",
)
def test_glibc_takes_the_thresholds() -> None:
    assert reuse_large_buffers()
