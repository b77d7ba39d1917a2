"""A fan-out's report three ways: a terminal table, JSON for machines, an HTML page with charts.

The HTML page embeds its own data (a JSON script element with id "farm-data", the same document
as the JSON report) and its charts as PNG data URLs drawn with matplotlib, so it is one file
that can be archived as a CI artifact.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rknn_client.farm.runner import DeviceResult, FanoutReport


def report_dict(report: FanoutReport) -> dict[str, Any]:
    """The JSON document: the report's fields, each device with its min cosine; NaN as null."""
    data = asdict(report)
    for device, result in zip(data["devices"], report.devices, strict=True):
        device["min_cosine"] = result.min_cosine
    return _finite(data)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_json(report: FanoutReport, path: Path) -> None:
    path.write_text(json.dumps(report_dict(report), indent=2) + "\n")


def _status(result: DeviceResult) -> str:
    if not result.ok:
        return f"FAILED ({result.failed_stage})"
    if result.agrees is None:
        return "ok (not compared)"
    return "ok" if result.agrees else "DISAGREES"


def _cells(result: DeviceResult) -> list[str]:
    low = result.min_cosine
    return [
        result.name + (" *" if result.is_reference else ""),
        result.soc or "?",
        _status(result),
        f"{result.latency_us / 1000:.3f}" if result.ok else "-",
        f"{result.inference_us / 1000:.3f}" if result.ok else "-",
        f"{result.memory_bytes / (1 << 20):.2f}" if result.ok else "-",
        f"{low:.6f}" if low is not None else "-",
    ]


HEADERS = ["device", "soc", "status", "latency ms", "run ms", "memory MiB", "min cosine"]


def table_text(report: FanoutReport) -> str:
    """The terminal table, then one line per failed device with its error."""
    rows = [HEADERS, *(_cells(r) for r in report.devices)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        f"reference: {report.reference}"
        + (" (* marks it)" if any(r.is_reference for r in report.devices) else "")
    ]
    notes.append(f"agreement: every output's cosine similarity >= {report.threshold:g}")
    notes += [f"{r.name}: {r.error}" for r in report.devices if r.error]
    return "\n".join([*lines, "", *notes]) + "\n"


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def latency_chart(report: FanoutReport) -> str:
    """Bar chart of each device's latency; failed devices appear with a 'failed' mark."""
    from matplotlib.figure import Figure

    names = [r.name for r in report.devices]
    values = [r.latency_us / 1000 if r.ok else 0.0 for r in report.devices]
    figure = Figure(figsize=(max(4.0, 1.2 * len(names)), 3.2))
    axes = figure.subplots()
    bars = axes.bar(names, values, color=["#3b7dd8" if r.ok else "#cccccc" for r in report.devices])
    for bar, result in zip(bars, report.devices, strict=True):
        label = f"{result.latency_us / 1000:.2f}" if result.ok else "failed"
        axes.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    axes.set_ylabel("latency per inference (ms)")
    axes.set_title("Latency by device")
    axes.tick_params(axis="x", labelrotation=20)
    return _png(figure)


def layer_names(report: FanoutReport) -> list[str]:
    """Every layer any device reported, in first-seen execution order."""
    return list(dict.fromkeys(layer.name for r in report.devices for layer in r.layers))


def layer_chart(report: FanoutReport, names: list[str]) -> str:
    """Grouped horizontal bars: per layer, one bar per device that reported layer times."""
    from matplotlib.figure import Figure

    devices = [r for r in report.devices if r.layers]
    figure = Figure(figsize=(7.0, max(2.5, 0.35 * len(names) * max(1, len(devices)) + 1)))
    axes = figure.subplots()
    height = 0.8 / max(1, len(devices))
    for i, result in enumerate(devices):
        times = {layer.name: layer.time_us for layer in result.layers}
        axes.barh(
            [k + i * height for k in range(len(names))],
            [times.get(n, 0.0) for n in names],
            height=height,
            label=result.name,
        )
    axes.set_yticks([k + height * (len(devices) - 1) / 2 for k in range(len(names))], labels=names)
    axes.invert_yaxis()
    axes.set_xlabel("time (µs)")
    axes.set_title("Per-layer time by device")
    if devices:
        axes.legend()
    return _png(figure)


def _td(text: object, cls: str = "") -> str:
    return f'<td class="{cls}">{html.escape(str(text))}</td>' if cls else f"<td>{html.escape(str(text))}</td>"


def html_page(report: FanoutReport) -> str:
    data = json.dumps(report_dict(report)).replace("</", "<\\/")
    device_rows = "\n".join(
        "<tr>" + "".join(_td(c) for c in _cells(r)) + _td(r.error, "error") + "</tr>" for r in report.devices
    )
    names = layer_names(report)
    with_layers = [r for r in report.devices if r.layers]
    layer_rows = []
    for name in names:
        cells = []
        for result in with_layers:
            times = {layer.name: layer.time_us for layer in result.layers}
            cells.append(_td(f"{times[name]:.1f}" if name in times else "-"))
        layer_rows.append("<tr>" + _td(name) + "".join(cells) + "</tr>")
    layer_section = (
        f'<img id="layer-chart" alt="per-layer time by device" src="{layer_chart(report, names)}">\n'
        '<table id="layers"><tr><th>layer</th>'
        + "".join(f"<th>{html.escape(r.name)} (µs)</th>" for r in with_layers)
        + "</tr>\n"
        + "\n".join(layer_rows)
        + "</table>"
        if names
        else "<p>No device reported per-layer times.</p>"
    )
    title = f"RKNN farm report: {Path(report.model).name}"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }}
td.error {{ color: #a00; font-family: monospace; white-space: pre-wrap; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>Model {html.escape(report.model)}, started {html.escape(report.started_at)}, {report.duration_s:.1f}s.
Reference: {html.escape(report.reference)}. Agreement: every output's cosine similarity &ge; {report.threshold:g}.</p>
<h2>Devices</h2>
<table id="devices">
<tr>{"".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)}<th>error</th></tr>
{device_rows}
</table>
<h2>Latency</h2>
<img id="latency-chart" alt="latency by device" src="{latency_chart(report)}">
<h2>Per-layer time</h2>
{layer_section}
<script type="application/json" id="farm-data">{data}</script>
</body>
</html>
"""


def write_html(report: FanoutReport, path: Path) -> None:
    path.write_text(html_page(report))
