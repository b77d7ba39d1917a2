"""The memory budget's parts on their own: sizes as the flags take them, and reservations that end
with the buffers they pay for."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from rknn_server.cli import serve_parser
from rknn_server.config.limits import MemoryLimits
from rknn_server.config.sizes import parse_size
from rknn_server.core.memory import MemoryBudget
from rknn_server.errors import ResourceExhausted


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1048576", 1 << 20),
        ("512MiB", 512 << 20),
        ("2GiB", 2 << 30),
        ("2gib", 2 << 30),
        ("1.5GB", 1_500_000_000),
        ("64k", 64_000),
        ("64KiB", 64 << 10),
        (" 3 MB ", 3_000_000),
        ("0", 0),
    ],
)
def test_sizes_take_bytes_or_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1", "2 GiB extra", "1e9", "GiB"])
def test_a_size_that_is_not_one_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected bytes or a number with a unit, e\.g\. 512MiB or 2GiB"):
        parse_size(text)


def test_the_flags_take_sizes_and_default_to_shares_of_the_ram(capsys: pytest.CaptureFixture[str]) -> None:
    args = serve_parser().parse_args(["--max-memory", "1GiB", "--max-session-memory", "256MiB"])
    assert (args.max_memory_bytes, args.max_session_memory_bytes) == (1 << 30, 256 << 20)
    defaults = serve_parser().parse_args([])
    assert (defaults.max_memory_bytes, defaults.max_session_memory_bytes) == (
        MemoryLimits.for_machine().max_memory,
        MemoryLimits.for_machine().max_session_memory,
    )
    assert MemoryLimits.for_machine(ram=4 << 30) == MemoryLimits(
        max_memory=2 << 30, max_session_memory=1 << 30
    )
    with pytest.raises(SystemExit):
        serve_parser().parse_args(["--max-memory", "much"])
    assert "'much' is not a size" in capsys.readouterr().err


def test_a_reservation_lasts_as_long_as_its_buffers() -> None:
    budget = MemoryBudget(1000)
    first = [np.empty(600, np.uint8)]
    budget.hold(first, "frame 1's inputs")
    with pytest.raises(ResourceExhausted, match=r"max_memory=1000 \(--max-memory\)"):
        budget.hold([np.empty(500, np.uint8)], "frame 2's inputs")
    assert budget.used == 600
    view = first[0][100:]  # a view keeps its buffer, and so the reservation, alive
    del first
    gc.collect()
    assert budget.used == 600
    del view
    assert budget.used == 0
    third = [np.empty(500, np.uint8), np.empty(500, np.uint8)]
    budget.hold(third, "frame 3's inputs")
    assert budget.used == 1000
    third.pop()
    assert budget.used == 500


def test_no_limit_holds_anything() -> None:
    budget = MemoryBudget(0)
    buffers = [np.empty(1 << 20, np.uint8)]
    budget.hold(buffers, "a frame's inputs")
    assert budget.used == 1 << 20
