"""Parsing the runtime's RKNN_QUERY_PERF_DETAIL text into LayerPerf rows.

The text is the "Network Layer Information Table" the toolkit prints: a header row starting with
`ID` and `OpType`, then one row per layer, columns separated by `|` (older runtimes separate them
with blanks), then footer lines such as `Total Operator Elapsed Per Frame Time(us): N`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rknn_proto.messages import LayerPerf

_CORE_COLUMNS = ("ID", "OpType", "DataType", "Target", "InputShape", "OutputShape", "Time(us)", "FullName")
_SHAPE_RE = re.compile(r"\([^)]*\)")
_TOTAL_TIME_RE = re.compile(r"Total Operator Elapsed(?: Per Frame)? Time\(us\):\s*([\d.]+)")
_RW_KB_RE = re.compile(r"Total Memory Read/Write Per Frame Size\(KB\):\s*([\d.]+)")
_RW_MB_RE = re.compile(r"Total Memory RW Amount\(MB\):\s*([\d.]+)")


@dataclass(frozen=True)
class PerfTable:
    layers: tuple[LayerPerf, ...]
    extra_columns: tuple[str, ...]
    operator_time_us: float
    rw_kb: float


def _split(line: str) -> list[str]:
    if "|" in line:
        return [cell.strip() for cell in line.split("|")]
    return line.split()


def _shapes(cell: str) -> tuple[str, ...]:
    return tuple(_SHAPE_RE.findall(cell))


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return 0.0


def _row(columns: list[str], cells: list[str], extra: tuple[str, ...]) -> LayerPerf | None:
    if len(cells) != len(columns) or not cells[0].isdigit():
        return None
    value = dict(zip(columns, cells, strict=True))
    output = _shapes(value.get("OutputShape", ""))
    return LayerPerf(
        index=int(cells[0]),
        op_type=value.get("OpType", ""),
        data_type=value.get("DataType", ""),
        target=value.get("Target", ""),
        input_shapes=_shapes(value.get("InputShape", "")),
        output_shape=output[0] if output else "",
        time_us=_number(value.get("Time(us)", "0")),
        name=value.get("FullName", ""),
        extra={name: value[name] for name in extra},
    )


def parse_perf_detail(text: str) -> PerfTable:
    """Rows of the layer table (others skipped), the names of the non-core columns, and the footer."""
    layers: list[LayerPerf] = []
    columns: list[str] = []
    extra: tuple[str, ...] = ()
    for line in text.splitlines():
        cells = _split(line.strip())
        if len(cells) >= 2 and cells[0] == "ID" and cells[1] == "OpType":
            columns = cells
            extra = tuple(name for name in columns if name not in _CORE_COLUMNS)
            continue
        row = _row(columns, cells, extra) if columns and cells else None
        if row is not None:
            layers.append(row)
    total = _TOTAL_TIME_RE.search(text)
    rw_kb = _RW_KB_RE.search(text)
    rw_mb = _RW_MB_RE.search(text)
    return PerfTable(
        layers=tuple(layers),
        extra_columns=extra,
        operator_time_us=float(total.group(1)) if total else sum(layer.time_us for layer in layers),
        rw_kb=float(rw_kb.group(1)) if rw_kb else float(rw_mb.group(1)) * 1024 if rw_mb else 0.0,
    )
