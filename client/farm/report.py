"""A fan-out's report three ways: a terminal table, JSON for machines, an HTML page with charts.

The HTML page (a jinja2 template) embeds its own data (a JSON script element with id "farm-data",
the same document as the JSON report), interactive Plotly charts and plotly.js itself, so it is
one file that works offline as a CI artifact. Its headline (the verdict and the latency of each
board with its spread) fits the first screen; the slowest layers per board, each board's layer
times against the reference and the agreement of every output follow, in sortable tables.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rknn_client.farm.runner import DeviceResult, FanoutReport, LayerTime

# How many of each board's slowest layers the report shows.
TOP_LAYERS = 10
OK_COLOR, DISAGREE_COLOR, FAILED_COLOR = "#3b7dd8", "#e8890c", "#b0b0b0"


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


def status(result: DeviceResult) -> str:
    if result.cancelled:
        return f"CANCELLED (at {result.failed_stage})"
    if not result.ok:
        return f"FAILED ({result.failed_stage})"
    if result.agrees is None:
        return "ok (not compared)"
    return "ok" if result.agrees else "DISAGREES"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def _cells(result: DeviceResult) -> list[str]:
    low = result.min_cosine
    lat = result.latency
    return [
        result.name + (f" @ {result.host}" if result.host else "") + (" *" if result.is_reference else ""),
        result.soc or "?",
        status(result),
        *([_ms(lat.p50_us), _ms(lat.p90_us), _ms(lat.min_us), _ms(lat.max_us)] if lat else ["-"] * 4),
        f"{result.memory_bytes / (1 << 20):.2f}" if result.ok else "-",
        f"{low:.6f}" if low is not None else "-",
    ]


# A labgrid device reads "PLACE @ EXPORTER".
HEADERS = ["device", "soc", "status", "p50 ms", "p90 ms", "min ms", "max ms", "memory MiB", "min cosine"]


def summary(report: FanoutReport) -> str:
    """The verdict in one line: how many boards ran, failed and disagreed."""
    total = len(report.devices)
    ok = sum(r.ok for r in report.devices)
    cancelled = sum(r.cancelled for r in report.devices)
    disagree = sum(r.ok and r.agrees is False for r in report.devices)
    text = (
        f"{ok} of {total} device(s) ran, {total - ok - cancelled} failed"
        + (f", {cancelled} cancelled" if cancelled else "")
        + f", {disagree} disagree with the reference"
    )
    return ("CANCELLED (Ctrl-C), partial report: " if report.cancelled else "") + text


def _runs_done(result: DeviceResult) -> str:
    """For a device stopped while timing: how many timed runs its latency columns are made of."""
    return f" after {result.latency.runs} timed run(s)" if result.latency and not result.ok else ""


def table_text(report: FanoutReport) -> str:
    """The terminal table, then one line per failed device with its error."""
    rows = [HEADERS, *(_cells(r) for r in report.devices)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        summary(report),
        f"latency: the runtime's time per inference over {report.runs} timed run(s) after "
        f"{report.warmup} warm-up run(s)",
        f"reference: {report.reference}"
        + (" (* marks it)" if any(r.is_reference for r in report.devices) else ""),
        f"agreement: every output's cosine similarity >= {report.threshold:g}",
    ]
    notes += [f"{r.name}: {r.error}{_runs_done(r)}" for r in report.devices if r.error]
    return "\n".join([*lines, "", *notes]) + "\n"


def _plain(text: str) -> str:
    """Board-supplied text as plotly shows it verbatim. Plotly renders `<a href>`, `<b>`, `<br>` in
    tick labels, titles, legends and hover text (and what a hovertemplate's `%{x}` inserts) even from
    the figure's JSON, so a board named `<a href=...>` would put a link in the report: as entities,
    plotly displays the characters instead."""
    return html.escape(text, quote=False)


def _color(result: DeviceResult) -> str:
    if not result.ok:
        return FAILED_COLOR
    return DISAGREE_COLOR if result.agrees is False else OK_COLOR


def latency_figure(report: FanoutReport) -> Any:
    """The headline: p50 per device with min-max whiskers and a p90 mark; failed devices named."""
    import plotly.graph_objects as go

    timed = [r for r in report.devices if r.latency]
    names = [_plain(r.name) for r in timed]
    figure = go.Figure()
    figure.add_bar(
        name="p50",
        x=names,
        y=[r.latency.p50_us / 1000 for r in timed if r.latency],
        marker_color=[_color(r) for r in timed],
        error_y={
            "type": "data",
            "symmetric": False,
            "array": [(r.latency.max_us - r.latency.p50_us) / 1000 for r in timed if r.latency],
            "arrayminus": [(r.latency.p50_us - r.latency.min_us) / 1000 for r in timed if r.latency],
            "color": "#444",
        },
        customdata=[
            [
                r.latency.p90_us / 1000,
                r.latency.min_us / 1000,
                r.latency.max_us / 1000,
                r.latency.runs,
                _plain(status(r)),
            ]
            for r in timed
            if r.latency
        ],
        hovertemplate="<b>%{x}</b> (%{customdata[4]})<br>p50 %{y:.3f} ms<br>p90 %{customdata[0]:.3f} ms"
        "<br>min %{customdata[1]:.3f} ms, max %{customdata[2]:.3f} ms<br>%{customdata[3]} runs<extra></extra>",
    )
    figure.add_scatter(
        name="p90",
        x=names,
        y=[r.latency.p90_us / 1000 for r in timed if r.latency],
        mode="markers",
        marker={"symbol": "line-ew-open", "size": 28, "color": "#c0392b", "line": {"width": 3}},
        hoverinfo="skip",
    )
    failed = [r for r in report.devices if not r.ok]
    for result in failed:
        figure.add_annotation(
            x=_plain(result.name), y=0, text=_plain(status(result)), showarrow=False, yanchor="bottom"
        )
    if failed:  # a category of its own, so a failed device keeps its place on the axis
        figure.update_xaxes(categoryorder="array", categoryarray=[_plain(r.name) for r in report.devices])
    figure.update_layout(
        title=f"Latency per inference: p50 bar, min-max whisker, p90 mark ({report.runs} runs)",
        yaxis_title="ms",
        height=340,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        showlegend=False,
        bargap=0.45,
    )
    return figure


def slowest_layers(layers: list[LayerTime], count: int = TOP_LAYERS) -> list[LayerTime]:
    return sorted(layers, key=lambda layer: layer.time_us, reverse=True)[:count]


def top_layers_figure(report: FanoutReport) -> Any:
    """One small bar chart per device: its slowest layers, slowest at the top."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    devices = [r for r in report.devices if r.layers]
    columns = min(3, len(devices))
    rows = math.ceil(len(devices) / columns)
    figure = make_subplots(
        rows=rows, cols=columns, subplot_titles=[_plain(r.name) for r in devices], horizontal_spacing=0.22
    )
    for i, result in enumerate(devices):
        top = slowest_layers(result.layers)[::-1]
        figure.add_trace(
            go.Bar(
                x=[layer.time_us for layer in top],
                y=[_plain(layer.name) for layer in top],
                orientation="h",
                marker_color=_color(result),
                customdata=[_plain(layer.op_type) for layer in top],
                meta=_plain(result.name),  # a name in the template itself would be read as its markup
                hovertemplate="%{meta}<br>%{y} (%{customdata})<br>%{x:.1f} µs<extra></extra>",
            ),
            row=i // columns + 1,
            col=i % columns + 1,
        )
    figure.update_xaxes(title_text="µs")
    figure.update_layout(
        height=60 + 28 * TOP_LAYERS * rows, showlegend=False, margin={"l": 20, "r": 20, "t": 40, "b": 40}
    )
    return figure


def layer_comparison(report: FanoutReport) -> list[dict[str, Any]]:
    """Per layer of the reference: its time, and each device's time and ratio to it."""
    rows = []
    devices = [r for r in report.devices if r.layers and not r.is_reference]
    times = [{layer.name: layer.time_us for layer in r.layers} for r in devices]
    for layer in report.reference_layers:
        cells = []
        for device_times in times:
            mine = device_times.get(layer.name)
            ratio = mine / layer.time_us if mine is not None and layer.time_us > 0 else None
            cells.append({"time_us": mine, "ratio": ratio})
        rows.append(
            {"layer": layer.name, "op_type": layer.op_type, "reference_us": layer.time_us, "devices": cells}
        )
    return rows


def comparison_figure(report: FanoutReport) -> Any:
    """Each device's layer time against the reference's, log-log: above the diagonal is slower."""
    import plotly.graph_objects as go

    reference = {layer.name: layer.time_us for layer in report.reference_layers}
    figure = go.Figure()
    low, high = math.inf, 0.0
    for result in report.devices:
        if result.is_reference or not result.layers:
            continue
        pairs = [
            (reference[x.name], x.time_us, x.name) for x in result.layers if reference.get(x.name, 0) > 0
        ]
        pairs = [p for p in pairs if p[1] > 0]
        if not pairs:
            continue
        low = min(low, *(min(a, b) for a, b, _ in pairs))
        high = max(high, *(max(a, b) for a, b, _ in pairs))
        figure.add_scatter(
            name=_plain(result.name),
            x=[a for a, _, _ in pairs],
            y=[b for _, b, _ in pairs],
            mode="markers",
            text=[_plain(n) for _, _, n in pairs],
            customdata=[b / a for a, b, _ in pairs],
            meta=_plain(result.name),
            hovertemplate="%{meta}<br>%{text}<br>reference %{x:.1f} µs<br>this %{y:.1f} µs"
            "<br>x%{customdata:.2f}<extra></extra>",
        )
    if high > 0:
        figure.add_scatter(
            name="same time",
            x=[low, high],
            y=[low, high],
            mode="lines",
            line={"dash": "dot", "color": "#888"},
        )
    figure.update_xaxes(type="log", title_text="reference layer time (µs)")
    figure.update_yaxes(type="log", title_text="device layer time (µs)")
    figure.update_layout(height=420, margin={"l": 60, "r": 20, "t": 30, "b": 50})
    return figure


def _chart(figure: Any, div_id: str) -> str:
    """A figure's div and script; plotly.js itself is inlined once by the template."""
    html: str = figure.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )
    return html


def html_page(report: FanoutReport) -> str:
    import jinja2
    from plotly.offline import get_plotlyjs

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("rknn_client.farm"),
        autoescape=jinja2.select_autoescape(default=True),
        undefined=jinja2.StrictUndefined,
    )
    with_layers = [r for r in report.devices if r.layers]
    compared = [r for r in report.devices if r.layers and not r.is_reference]
    outputs = max((len(r.cosine) for r in report.devices), default=0)
    charts = {"latency": _chart(latency_figure(report), "latency-chart")}
    if with_layers:
        charts["top_layers"] = _chart(top_layers_figure(report), "top-layers-chart")
    if compared and report.reference_layers:
        charts["comparison"] = _chart(comparison_figure(report), "layer-comparison-chart")
    return environment.get_template("report.html.j2").render(
        report=report,
        title=f"RKNN farm report: {Path(report.model).name}",
        summary=summary(report),
        headers=HEADERS,
        rows=[(r, _cells(r)) for r in report.devices],
        failed=any(not r.ok for r in report.devices),
        disagree=any(r.ok and r.agrees is False for r in report.devices),
        charts=charts,
        top={r.name: slowest_layers(r.layers) for r in with_layers},
        top_count=TOP_LAYERS,
        compared=compared,
        comparison=layer_comparison(report),
        outputs=outputs,
        plotly_js=get_plotlyjs(),
        data=_script_json(report_dict(report)),
    )


def _script_json(value: Any) -> str:
    """JSON to inline in a <script> element: no `<`, `>` or `&` in it, so no board-supplied `</script>`
    or `<!--` can end or change the element (JSON reads the escapes back as the same characters)."""
    text = json.dumps(value)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def write_html(report: FanoutReport, path: Path) -> None:
    path.write_text(html_page(report))
