"""What the terminal shows of an accuracy analysis: the worst layers first, and the whole as JSON.

The toolkit's full table (every layer in model order) stays in error_analysis.txt.
"""

from __future__ import annotations

from typing import Any

from rknn_client.accuracy.analysis import REPORT_FILE, AnalysisResult, LayerRow
from rknn_client.accuracy.compare import ErrorPair


def _worst_cos(row: LayerRow) -> float:
    pairs = [p for p in (row.entire, row.runtime_entire) if p is not None]
    return min((p.cos for p in pairs), default=1.0)


def _cell(pair: ErrorPair | None) -> str:
    return "-" if pair is None else f"{pair.cos:.5f}"


def worst_layers_text(result: AnalysisResult, count: int) -> str:
    """The `count` layers with the lowest cosine (simulator or runtime vs golden), aligned, worst first."""
    ranked = sorted(result.rows, key=_worst_cos)[: max(count, 0)]
    head = ["cos entire", "cos single"] + (["cos runtime", "cos single_sim"] if result.has_runtime else [])
    rows = [["layer", *head]]
    for row in ranked:
        cells = [_cell(row.entire), _cell(row.single)]
        if result.has_runtime:
            cells += [_cell(row.runtime_entire), _cell(row.single_sim)]
        rows.append([row.label, *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"The {len(ranked)} layers of {len(result.rows)} with the largest error (lowest cosine) first:"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(f"Every layer, in model order, with euclidean distances: {result.output_dir / REPORT_FILE}")
    return "\n".join(lines) + "\n"


def _pair(pair: ErrorPair | None) -> dict[str, float] | None:
    return None if pair is None else {"cos": pair.cos, "euc": pair.euc}


def accuracy_json(result: AnalysisResult) -> dict[str, Any]:
    return {
        "output_dir": str(result.output_dir),
        "report_file": str(result.output_dir / REPORT_FILE),
        "has_runtime": result.has_runtime,
        "only_runtime": list(result.only_runtime),
        "layers": [
            {
                "index": row.index,
                "op_type": row.op_type,
                "name": row.name,
                "entire": _pair(row.entire),
                "single": _pair(row.single),
                "runtime_entire": _pair(row.runtime_entire),
                "single_sim": _pair(row.single_sim),
            }
            for row in result.rows
        ],
    }
