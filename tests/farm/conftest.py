"""Simulated farm boards: host-runtime daemons on free loopback ports, each declaring a SoC."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rknn_server.testing import DaemonProcess
from tests.conftest import DaemonFactory

SOCS = ("rk3588", "rk3566", "rv1106")


@pytest.fixture
def boards(make_daemon: DaemonFactory) -> list[DaemonProcess]:
    """Three boards, one per SoC in SOCS, named b0..b2 in farm files; started side by side (one after
    another they were most of each farm test's time)."""
    with ThreadPoolExecutor(len(SOCS)) as pool:
        return list(pool.map(lambda i: make_daemon("--soc", SOCS[i], name=f"b{i}"), range(len(SOCS))))


def write_farm_file(path: Path, boards: list[DaemonProcess]) -> Path:
    """farm.toml for the boards: b0..bN, rack r0 for even, r1 for odd positions."""
    path.write_text(
        "".join(
            f'[[device]]\nname = "b{i}"\naddress = "{b.url}"\nlabels = {{ rack = "r{i % 2}" }}\n\n'
            for i, b in enumerate(boards)
        )
    )
    return path


@pytest.fixture
def farm_file(tmp_path: Path, boards: list[DaemonProcess]) -> Path:
    return write_farm_file(tmp_path / "farm.toml", boards)
