"""`START:END[:STEP]` ranges of `rknn-client perf`: the steps they make, and what a bad one is told."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from rknn_client.load import ranges


@pytest.mark.parametrize(
    ("text", "steps"),
    [("1:8", [1, 2, 3, 4, 5, 6, 7, 8]), ("1:16:4", [1, 5, 9, 13]), ("2:2", [2]), ("3:8:10", [3])],
)
def test_concurrency_ranges_step_up_to_end_inclusive(text: str, steps: list[int]) -> None:
    assert ranges.concurrency_range(text) == steps


def test_rate_ranges_take_fractions_and_reach_an_end_that_binary_fractions_miss() -> None:
    assert ranges.rate_range("0.5:2:0.5") == [0.5, 1.0, 1.5, 2.0]
    assert ranges.rate_range("10:30:10") == [10.0, 20.0, 30.0]
    assert ranges.rate_range("0.1:0.3:0.1") == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (
            ranges.concurrency_range,
            "8:1",
            "END (1) is below START (8) in '8:1'; expected START:END or START:END:STEP",
        ),
        (ranges.concurrency_range, "4", "'4' is not a range; expected START:END or START:END:STEP, e.g. 1:8"),
        (ranges.concurrency_range, "1:2:3:4", "'1:2:3:4' is not a range"),
        (ranges.concurrency_range, "0:4", "START in '0:4' must be a finite number above 0, not 0"),
        (ranges.concurrency_range, "1:4:0", "STEP in '1:4:0' must be a finite number above 0, not 0"),
        (ranges.concurrency_range, "1.5:4", "START '1.5' in '1.5:4' is not a whole number"),
        (ranges.concurrency_range, "1:x", "END 'x' in '1:x' is not a whole number"),
        (ranges.concurrency_range, "100:300:100", "concurrency 300 in '100:300:100' is above 256"),
        (ranges.concurrency_range, "1:1000", "'1:1000' makes 1000 steps; at most 100"),
        (ranges.rate_range, "-5:10", "START in '-5:10' must be a finite number above 0, not -5"),
        (ranges.rate_range, "nan:10", "START in 'nan:10' must be a finite number above 0"),
        (ranges.rate_range, "1:inf", "END in '1:inf' must be a finite number above 0"),
        (ranges.rate_range, "ten:20", "START 'ten' in 'ten:20' is not a number"),
        (ranges.rate_range, "1:100:0.5", "makes 199 steps; at most 100"),
        (ranges.concurrency, "0", "N in '0' must be a finite number above 0, not 0"),
        (ranges.concurrency, "999", "concurrency 999 in '999' is above 256"),
    ],
)
def test_bad_ranges_say_what_was_wrong_and_what_was_expected(
    parse: Callable[[str], object], text: str, message: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert message in str(refused.value)
