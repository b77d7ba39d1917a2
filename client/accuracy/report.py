"""What accuracy analysis leaves on disk and prints: per-layer .npy files and the toolkit's error table.

File names follow the board's dumps: `{index:03d}_{OpType}_{tensor}_shape_{d0_d1_...}_{dtype}.npy`
(`float` for float32, numpy's name otherwise). Names that come from models or from a daemon are cut
down to [A-Za-z0-9._-] (anything else becomes `_`, long names are shortened with a hash), so a file
always lands directly inside its folder. Table layout: a `#` legend, then one row per layer,
`[OpType] tensor  cos | euc  cos | euc`, cos with 5 decimals, euc with 5 significant digits; a row
without values shows only its name.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from rknn_client.accuracy.compare import ErrorPair
from rknn_client.accuracy.errors import AccuracyError

MAX_NAME = 96
PAIR_WIDTH = 20
NAME_MIN_WIDTH = 24
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class LayerLike(Protocol):
    """Anything that says where a tensor comes from: capture.LayerInfo, the daemon's layer dumps."""

    @property
    def index(self) -> int: ...

    @property
    def op_type(self) -> str: ...

    @property
    def tensor_name(self) -> str: ...


@dataclass(frozen=True)
class TableSpec:
    """The fixed text of one table: its title, legend and the names of its two column groups."""

    title: str
    legend: tuple[str, ...]
    first: str
    second: str


SIMULATOR_TABLE = TableSpec(
    "simulator_error",
    (
        "# simulator_error: calculate the output error of each layer of the simulator "
        "(compared to the 'golden' value).",
        "# entire: output error of each layer between 'golden' and 'simulator', "
        "these errors will accumulate layer by layer.",
        "# single: single-layer output error between 'golden' and 'simulator', "
        "can better reflect the single-layer accuracy of the simulator.",
    ),
    "entire",
    "single",
)
RUNTIME_TABLE = TableSpec(
    "runtime_error",
    (
        "# runtime_error: calculate the output error of each layer of the runtime.",
        "# entire: output error of each layer between 'golden' and 'runtime', "
        "these errors will accumulate layer by layer.",
        "# single_sim: single-layer output error between 'simulator' and 'runtime', "
        "can better reflect the single-layer accuracy of runtime.",
    ),
    "entire",
    "single_sim",
)


@dataclass(frozen=True)
class TableRow:
    """One printed row: `[OpType] name` and the two cell pairs (None prints blank)."""

    label: str
    first: ErrorPair | None
    second: ErrorPair | None


def safe_name(text: str) -> str:
    """`text` as one safe file-name component: no separators, no leading dot, bounded length."""
    cleaned = UNSAFE.sub("_", text).lstrip(".") or "_"
    if len(cleaned) <= MAX_NAME:
        return cleaned
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{cleaned[: MAX_NAME - 9]}_{digest}"


def layer_file_name(layer: LayerLike, array: np.ndarray) -> str:
    """The dump name of one layer's tensor."""
    shape = "_".join(str(dim) for dim in array.shape) or "scalar"
    dtype = "float" if array.dtype == np.float32 else safe_name(array.dtype.name)
    op_type, tensor = safe_name(layer.op_type), safe_name(layer.tensor_name)
    return f"{layer.index:03d}_{op_type}_{tensor}_shape_{shape}_{dtype}.npy"


def remove_layers(directory: Path) -> None:
    """Delete an earlier run's dumps from `directory`, and the folder if that empties it."""
    if not directory.is_dir():
        return
    try:
        for stale in directory.glob("*.npy"):
            stale.unlink()
        if not any(directory.iterdir()):
            directory.rmdir()
    except OSError as exc:
        raise AccuracyError(f"cannot remove earlier layer dumps from {directory}: {exc}") from exc


def write_layers(directory: Path, layers: Iterable[tuple[LayerLike, np.ndarray]]) -> None:
    """Create `directory` (emptied of earlier dumps) and save one .npy per layer in it."""
    remove_layers(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for layer, array in layers:
            value = np.asarray(array)
            np.save(directory / layer_file_name(layer, value), value, allow_pickle=False)
    except OSError as exc:
        raise AccuracyError(f"cannot write layer dumps to {directory}: {exc}") from exc


def write_text_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError as exc:
        raise AccuracyError(f"cannot write {path}: {exc}") from exc


def format_euc(value: float) -> str:
    """Euclidean distance as the toolkit prints it: 5 significant digits, `0.0` for zero."""
    return "0.0" if value == 0 else f"{value:.5g}"


def format_pair(pair: ErrorPair | None) -> str:
    """`cos | euc`, or blanks."""
    return "" if pair is None else f"{pair.cos:.5f} | {format_euc(pair.euc)}"


def format_table(spec: TableSpec, rows: Sequence[TableRow]) -> str:
    """The legend and table as the toolkit prints them."""
    width = max([NAME_MIN_WIDTH, *(len(row.label) + 2 for row in rows)])
    lines = [
        *spec.legend,
        f"{'layer_name':<{width}}{spec.title}",
        f"{'':<{width}}{spec.first:<{PAIR_WIDTH}}{spec.second}",
        f"{'':<{width}}{'cos':<10}{'euc':<{PAIR_WIDTH - 10}}{'cos':<10}euc",
        "-" * (width + 2 * PAIR_WIDTH),
    ]
    for row in rows:
        cells = f"{format_pair(row.first):<{PAIR_WIDTH}}{format_pair(row.second)}"
        lines.append(f"{row.label:<{width}}{cells}".rstrip())
    return "\n".join(lines) + "\n"
