"""What accuracy analysis leaves on disk and prints, in RKNN-Toolkit2 2.5.0's layout.

Per side (`golden/`, `simulator/`, `runtime/`): `<file>.txt`, the tensor flattened with one value per
line (what the official example reads with `np.genfromtxt`), and `npy/<file>.npy`, the tensor itself.
`map_name_to_file.txt` maps each tensor name to its file: `.` and `/` become `_` as in the toolkit,
anything else outside [A-Za-z0-9_-] too, long names are shortened with a hash and a clash gets a
numeric suffix, so every file lands directly inside its folder and no two tensors share one.
Table (`error_analysis.txt`): the legend, a blank line, a three-line header (`layer_name`, then
`simulator_error` and, with a runtime, `runtime_error`; their `entire`/`single` and `entire`/`single_sim`
groups; `cos euc` under each), a rule, then one row per layer: `[OpType] tensor` and `cos | euc` cells,
cos with 5 decimals, euc with 5 significant digits (at most 4 decimals); a layer without values (fused
away on one side) shows only its name.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from rknn_client.accuracy.compare import ErrorPair
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.steps import Advance, Written
from rknn_client.accuracy.text_dump import write_lines

MAX_NAME = 96
PAIR_WIDTH = 20
GROUP_GAP = 4
NAME_MIN_WIDTH = 24
CELL_TITLES = ((0, "cos"), (9, "euc"), (PAIR_WIDTH, "cos"), (PAIR_WIDTH + 9, "euc"))
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
        "#              entire: output error of each layer between 'golden' and 'simulator', "
        "these errors will accumulate layer by layer.",
        "#              single: single-layer output error between 'golden' and 'simulator', "
        "can better reflect the single-layer accuracy of the simulator.",
    ),
    "entire",
    "single",
)
RUNTIME_TABLE = TableSpec(
    "runtime_error",
    (
        "# runtime_error: calculate the output error of each layer of the runtime.",
        "#              entire: output error of each layer between 'golden' and 'runtime', "
        "these errors will accumulate layer by layer.",
        "#              single_sim: single-layer output error between 'simulator' and 'runtime', "
        "can better reflect the single-layer accuracy of runtime.",
    ),
    "entire",
    "single_sim",
)


@dataclass(frozen=True)
class TableRow:
    """One printed row: `[OpType] name` and its cell pairs (None prints blank); third and fourth are
    the runtime's."""

    label: str
    first: ErrorPair | None
    second: ErrorPair | None
    third: ErrorPair | None = None
    fourth: ErrorPair | None = None


def safe_name(text: str) -> str:
    """`text` as one safe file-name component: no separators, no leading dot, bounded length."""
    cleaned = UNSAFE.sub("_", text).lstrip(".") or "_"
    if len(cleaned) <= MAX_NAME:
        return cleaned
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{cleaned[: MAX_NAME - 9]}_{digest}"


def tensor_file_names(names: Iterable[str]) -> dict[str, str]:
    """Each tensor name's file name (`.txt`), unique among `names`."""
    files: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        if name in files:
            continue
        stem = safe_name(name.replace(".", "_"))
        candidate, number = stem, 1
        while candidate.lower() in taken:
            number += 1
            candidate = f"{stem}_{number}"
        taken.add(candidate.lower())
        files[name] = f"{candidate}.txt"
    return files


def remove_side(directory: Path) -> None:
    """Delete an earlier run's tensors from `directory`, and the folders if that empties them."""
    if not directory.is_dir():
        return
    try:
        for stale in [*directory.glob("*.txt"), *directory.glob("npy/*.npy"), *directory.glob("*.npy")]:
            stale.unlink()
        for folder in (directory / "npy", directory):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    except OSError as exc:
        raise AccuracyError(f"cannot remove earlier tensors from {directory}: {exc}") from exc


def write_side(
    directory: Path, tensors: Mapping[str, np.ndarray], files: Mapping[str, str], advance: Advance
) -> Written:
    """Create `directory` (emptied of an earlier run) with `<file>.txt` and `npy/<file>.npy` per tensor;
    `advance(1)` after each tensor."""
    remove_side(directory)
    written = Written()
    try:
        (directory / "npy").mkdir(parents=True, exist_ok=True)
        for name, array in tensors.items():
            value = np.asarray(array)
            stem = files[name].removesuffix(".txt")
            text, binary = directory / f"{stem}.txt", directory / "npy" / f"{stem}.npy"
            write_values(text, value)
            np.save(binary, value, allow_pickle=False)
            written += Written.of(text, binary)
            advance(1)
    except OSError as exc:
        raise AccuracyError(f"cannot write tensors to {directory}: {exc}") from exc
    return written


def write_values(path: Path, value: np.ndarray) -> None:
    """One value per line, in the toolkit's text format (text_dump)."""
    with path.open("wb") as text:
        write_lines(text, value)


NAME_MAP_COLUMN = 56  # 2.5.0 pads both columns to 56 characters and rules the header off with dashes


def write_name_map(path: Path, files: Mapping[str, str]) -> None:
    """map_name_to_file.txt: the toolkit's `layer_name file_name` table (a longer name keeps one space)."""
    width = NAME_MAP_COLUMN
    rows = [("layer_name", "file_name"), *files.items()]
    lines = [f"{name:<{width - 1}} {file:<{width}}" for name, file in rows]
    lines.insert(1, "-" * 2 * width)
    write_text_atomically(path, "\n".join(lines) + "\n")


def write_text_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError as exc:
        raise AccuracyError(f"cannot write {path}: {exc}") from exc


def format_euc(value: float) -> str:
    """Euclidean distance as the toolkit prints it: 5 significant digits, at most 4 decimals, `0.0` for zero."""
    if value == 0:
        return "0.0"
    digits = max(0, 4 - max(0, math.floor(math.log10(abs(value)))))
    return f"{value:.{digits}f}"


def format_pair(pair: ErrorPair | None) -> str:
    """`cos | euc`, or blanks."""
    return "" if pair is None else f"{pair.cos:.5f} | {format_euc(pair.euc)}"


def format_table(rows: Sequence[TableRow], with_runtime: bool) -> str:
    """The legend and table as the toolkit prints them; the runtime columns sit beside the simulator's."""
    specs = (SIMULATOR_TABLE, RUNTIME_TABLE) if with_runtime else (SIMULATOR_TABLE,)
    width = max([NAME_MIN_WIDTH, *(len(row.label) + 2 for row in rows)])
    group = 2 * PAIR_WIDTH + GROUP_GAP

    def line(cells: Sequence[tuple[int, str]]) -> str:
        text = ""
        for column, cell in cells:
            text = f"{text:<{column}}{cell}"
        return text.rstrip()

    starts = [width + index * group for index in range(len(specs))]
    header = [
        line([(0, "layer_name"), *((start, spec.title) for start, spec in zip(starts, specs, strict=True))]),
        line(
            [
                cell
                for start, spec in zip(starts, specs, strict=True)
                for cell in ((start, spec.first), (start + PAIR_WIDTH, spec.second))
            ]
        ),
        line([(start + offset, name) for start in starts for offset, name in CELL_TITLES]),
        "-" * (width + len(specs) * group),
    ]
    body = []
    for row in rows:
        cells = [
            (0, row.label),
            (width, format_pair(row.first)),
            (width + PAIR_WIDTH, format_pair(row.second)),
        ]
        if with_runtime:
            cells += [(starts[1], format_pair(row.third)), (starts[1] + PAIR_WIDTH, format_pair(row.fourth))]
        body.append(line(cells))
    legend = [text for spec in specs for text in spec.legend]
    return "\n".join([*legend, "", *header, *body]) + "\n"
