"""A board's text cannot put markup into the farm report (security finding 9): names, SoC strings,
versions, errors, layer names and op types written as HTML reach the page as text, in its tables and
in the Plotly charts, whose tick labels, titles, legends and hover text plotly.js renders as HTML
(`<a href>` included) even from the figure's JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from rknn_client.farm.report import write_html
from rknn_client.farm.runner import DeviceResult, FanoutReport, LatencyStats, LayerTime
from tests.farm.html_data import parse_report
from tests.farm.test_report_browser import browse, chromium

EVIL = '<a href="http://x">x</a><script>alert(1)</script>&amp;'
# Markup plotly.js would render from a string (its pseudo-HTML), or a browser from the page.
LIVE = re.compile(r"<\s*(a|script|img|iframe)\b", re.IGNORECASE)


def hostile_report() -> FanoutReport:
    """A fan-out whose every board-supplied string is markup: two boards that ran, one that failed."""
    layers = [LayerTime(f"{EVIL}conv{i}", f"{EVIL}Conv", 10.0 * (i + 1)) for i in range(3)]

    def board(i: int, **extra: Any) -> DeviceResult:
        return DeviceResult(
            name=f"{EVIL}b{i}",
            address="tcp://127.0.0.1:9",
            labels={EVIL: EVIL},
            soc=EVIL,
            daemon_version=EVIL,
            runtime=EVIL,
            runtime_version=EVIL,
            driver_version=EVIL,
            **extra,
        )

    ran = {"ok": True, "latency": LatencyStats(5, 1000.0, 1500.0, 900.0, 2000.0), "cosine": [0.5]}
    devices = [
        board(0, is_reference=True, layers=layers, **ran),
        board(1, agrees=False, layers=[LayerTime(x.name, x.op_type, 2 * x.time_us) for x in layers], **ran),
        board(2, error=EVIL, failed_stage=EVIL),
    ]
    return FanoutReport(
        model=f"{EVIL}.rknn",
        reference=devices[0].name,
        threshold=0.99,
        inputs=[],
        started_at=EVIL,
        duration_s=1.0,
        devices=devices,
        warmup=1,
        runs=5,
        reference_layers=layers,
    )


class _Elements(HTMLParser):
    """The page's elements (tag, attributes) and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def figures(scripts: list[str]) -> Iterator[tuple[str, Any]]:
    """Each chart's id and its (data, layout) as plotly.js receives them."""
    decoder = json.JSONDecoder()
    for script in scripts:
        call = script.find("Plotly.newPlot(")
        if call < 0:
            continue
        chart, end = decoder.raw_decode(script, _skip(script, call + len("Plotly.newPlot(")))
        data, end = decoder.raw_decode(script, _skip(script, script.index(",", end) + 1))
        layout, _ = decoder.raw_decode(script, _skip(script, script.index(",", end) + 1))
        yield chart, [data, layout]


def _skip(text: str, at: int) -> int:
    while text[at].isspace():
        at += 1
    return at


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@pytest.fixture
def page(tmp_path: Path) -> Path:
    path = tmp_path / "report.html"
    write_html(hostile_report(), path)
    return path


def test_board_text_reaches_the_charts_as_text_not_markup(page: Path) -> None:
    elements = _Elements()
    elements.feed(page.read_text())
    charts = dict(figures(elements.scripts))
    assert set(charts) == {"latency-chart", "top-layers-chart", "layer-comparison-chart"}
    for chart, figure in charts.items():
        texts = list(strings(figure))
        live = [s for s in texts if LIVE.search(s)]
        assert not live, f"{chart}: markup plotly.js would render: {live[:3]}"
        # The board's text is there, as entities plotly shows verbatim (an `&` too, so `&amp;` stays).
        assert any("&lt;a href=" in s and "&amp;amp;" in s for s in texts), chart
        # A hovertemplate inserts its values as markup: those it names come from the data, escaped
        # above, and no board text is spliced into a template itself.
        templates = [s for s in texts if "%{" in s]
        assert templates and not [t for t in templates if "alert" in t], chart


def test_board_text_adds_no_element_to_the_page(page: Path) -> None:
    text = page.read_text()
    elements = _Elements()
    elements.feed(text)
    assert not [attrs for tag, attrs in elements.tags if tag in ("a", "img", "iframe")]
    assert not [s for s in elements.scripts if s.lstrip().startswith("alert")]
    assert text.count("<script") == len(elements.scripts)  # no script element opened inside another
    report = parse_report(text)
    assert report.data["devices"][2]["error"] == EVIL  # the embedded JSON reads back as it was
    assert any(EVIL in cell for row in report.tables["devices"] for cell in row)  # a cell shows it


def test_a_browser_draws_no_link_from_board_text(page: Path, tmp_path: Path) -> None:
    browser = chromium()
    dom = browse(browser, page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'class="main-svg"' in dom.stdout  # plotly.js ran and drew the charts
    assert not re.search(r"<a\b[^>]*http://x", dom.stdout), "a link from a board's name"
    drawn = dom.stdout[dom.stdout.index('id="latency-chart"') :]
    assert '&lt;a href="http://x"&gt;x&lt;/a&gt;' in drawn  # the name is drawn, as the text it is
