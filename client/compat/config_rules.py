"""`config()`'s argument rules, checked at config time as the toolkit does (an error there, not at build).

mean_values/std_values: one list per model input, or, for a single input, one flat list of per-channel
values (`[103.94, 116.78, 123.68]`, the user guide's own spelling), which means `[[103.94, ...]]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any


class ConfigError(ValueError):
    """A config() argument the toolkit would refuse; the message says what was expected."""


def _numbers(values: Any, what: str) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ConfigError(f"{what} must be a non-empty list of numbers, not {values!r}")
    if not all(isinstance(v, Real) for v in values):
        raise ConfigError(f"{what} must hold numbers only, not {list(values)!r}")
    return [float(v) for v in values]


def per_input(values: Any, what: str) -> list[list[float]] | None:
    """`values` as one list of channel values per input; a flat list is the single input's."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ConfigError(
            f"{what} must be a list per input (or one flat list for a single input), not {values!r}"
        )
    if all(isinstance(v, Real) for v in values):
        return [_numbers(values, what)]
    return [_numbers(entry, f"{what}[{index}]") for index, entry in enumerate(values)]


def normalization(mean: Any, std: Any) -> tuple[list[list[float]] | None, list[list[float]] | None]:
    """Both lists checked together: the same number of inputs, no zero std."""
    means, stds = per_input(mean, "mean_values"), per_input(std, "std_values")
    if means is not None and stds is not None and len(means) != len(stds):
        raise ConfigError(f"mean_values lists {len(means)} input(s) but std_values lists {len(stds)}")
    for index, entry in enumerate(stds or []):
        if any(v == 0 for v in entry):
            raise ConfigError(f"std_values[{index}] contains 0, which would divide by zero")
    return means, stds
