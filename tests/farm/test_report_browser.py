"""The HTML report of a real fan-out, opened offline in a real headless Chromium: the headline chart
renders (as SVG, from the plotly.js inlined in the page) and is on the first screen."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rknn_client.farm import Farm
from rknn_client.farm.report import OK_COLOR, write_html
from rknn_client.farm.runner import Timing, run_fanout
from rknn_server.testing import DaemonProcess
from tests.farm.conftest import write_farm_file

SCREEN = (1280, 800)
PLOT_BACKGROUND = (229, 236, 246)  # Plotly's default template: #E5ECF6

# Opens the report in a frame, clicks the devices table's "p50 ms" header twice and writes the row
# order before, after one click and after two into #out.
SORT_PROBE = """<!doctype html><html><body><pre id="out">pending</pre>
<iframe id="report" src="report.html" width="1280" height="800"></iframe>
<script>
document.getElementById("report").addEventListener("load", function () {
  var table = this.contentDocument.getElementById("devices");
  var order = function () {
    return Array.from(table.tBodies[0].rows).map(function (r) { return r.cells[0].textContent; }).join(",");
  };
  var header = Array.from(table.tHead.rows[0].cells).find(function (c) { return c.textContent === "p50 ms"; });
  var seen = [order()];
  header.click();
  seen.push(order());
  header.click();
  seen.push(order());
  document.getElementById("out").textContent = seen.join("|");
});
</script></body></html>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless Chromium: `make install` installs the distribution's chromium when run as root")


def browse(browser: str, page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium, headless, offline (no network is reachable from the page: it must be self-contained)."""
    return subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={profile}", f"--window-size={SCREEN[0]},{SCREEN[1]}",
            "--virtual-time-budget=15000", "--proxy-server=127.0.0.1:9", *args, page.as_uri(),
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_the_report_renders_its_headline_chart_on_the_first_screen(
    boards: list[DaemonProcess], cnn_model: Path, tmp_path: Path
) -> None:
    browser = chromium()
    with socket.socket() as s:  # a board nobody listens for: the report shows it failed
        s.bind(("127.0.0.1", 0))
        closed = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    farm_file = write_farm_file(tmp_path / "farm.toml", boards)
    with farm_file.open("a") as out:
        out.write(f'[[device]]\nname = "unplugged"\naddress = "{closed}"\n')
    image = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    report = run_fanout(Farm.from_file(farm_file), cnn_model, [image], timing=Timing(warmup=1, runs=5))
    page = tmp_path / "report.html"
    write_html(report, page)

    dom = browse(browser, page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    headline = dom.stdout[dom.stdout.index('id="latency-chart"') : dom.stdout.index('id="top-layers-chart"')]
    assert 'class="main-svg"' in headline  # plotly.js ran and drew the chart
    assert headline.count('class="errorbar"') == 3  # a min-max whisker per board that ran
    assert "FAILED (reserve)" in headline  # the unplugged board is named on the chart
    for chart in ("top-layers-chart", "layer-comparison-chart"):
        drawn = dom.stdout[dom.stdout.index(f'id="{chart}"') :]
        assert 'class="main-svg"' in drawn[:20000], chart

    # Sorting: a click on a header sorts by that column, a second reverses; the failed board stays last.
    (tmp_path / "sort.html").write_text(SORT_PROBE)
    probe = browse(
        browser, tmp_path / "sort.html", tmp_path / "profile", "--allow-file-access-from-files", "--dump-dom"
    )
    seen = probe.stdout.split('<pre id="out">', 1)[1].split("</pre>", 1)[0].split("|")
    shown = {d.name: round(d.latency.p50_us / 1000, 3) for d in report.devices if d.latency}  # as the cells
    ascending = sorted(shown, key=lambda name: shown[name])  # stable, as the page's sort: ties keep order
    descending = sorted(shown, key=lambda name: -shown[name])
    assert seen == [
        "b0,b1,b2,unplugged",
        ",".join([*ascending, "unplugged"]),
        ",".join([*descending, "unplugged"]),
    ], probe.stderr[-2000:]

    shot = tmp_path / "screen.png"
    taken = browse(browser, page, tmp_path / "profile", f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    assert pixels.shape[:2] == (SCREEN[1], SCREEN[0])
    top = pixels[: SCREEN[1] // 2]
    assert (top.min(axis=2) < 250).sum() > 0.05 * top.shape[0] * top.shape[1]  # not a blank (white) page

    # The headline chart is on the first screen, not below it: its plot area (Plotly's background
    # colour) spans most of the width, with bars (their colour) in it. A bar's height depends on the
    # measured spread (the axis reaches the slowest run), so any visible bar will do.
    def rows_of(colour: tuple[int, int, int], wide: int) -> np.ndarray:
        close = np.abs(pixels - np.array(colour)).max(axis=2) < 12
        return np.nonzero(close.sum(axis=1) > wide)[0]

    plot_area = rows_of(PLOT_BACKGROUND, SCREEN[0] // 3)
    assert plot_area.size > 150, "the latency chart's plot area is not on the first screen"
    bar_colour = (int(OK_COLOR[1:3], 16), int(OK_COLOR[3:5], 16), int(OK_COLOR[5:7], 16))
    assert rows_of(bar_colour, 20).size > 0, "no bar of the latency chart on the first screen"
