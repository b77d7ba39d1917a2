"""`rknn-client perf` load tests against a real daemon: the steps asked for, every request accounted for
(and counted by the daemon's own metrics), the open loop's rate, bad ranges, Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rknn_server.testing import DaemonProcess
from tests.cli_run import CliRun
from tests.conftest import DaemonFactory
from tests.metrics.conftest import MetricsDaemon, samples, scrape, start_metrics_daemon

# Short windows keep a step near a second; perf_analyzer's 5 s default is for real measurements.
QUICK = ["--measurement-interval", "300", "--max-trials", "4", "--warmup", "2", "--no-progress"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "load-testing.md"


def documented_fields() -> tuple[set[str], set[str]]:
    """(top-level, per-step) JSON fields named in the first column of the docs' field table."""
    top: set[str] = set()
    step: set[str] = set()
    for line in DOCS.read_text().splitlines():
        if line.startswith("| `"):
            names = re.findall(r"`([^`]+)`", line.split("|")[1])
            into = step if names[0].startswith("steps[].") else top
            into.update(n.removeprefix("steps[].").removesuffix("[]") for n in names)
    return top | {"steps"}, step


def perf(model: Path, device: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rknn_client.cli", "perf", str(model), "--device", device, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def accounted(step: dict) -> int:
    in_windows = sum(w["completed"] + w["errors"] + w["drops"] for w in step["windows"])
    return step["warmup"] + in_windows + step["after_windows"] + step["unresolved"]


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    running = start_metrics_daemon(tmp_path_factory.mktemp("perf-load"))
    yield running
    running.daemon.stop()


def test_concurrency_steps_count_every_request_as_the_daemon_does(
    metered: MetricsDaemon, cnn_model: Path
) -> None:
    result = perf(cnn_model, metered.daemon.url, "--concurrency-range", "1:4:3", "--json", *QUICK)
    assert result.returncode == 0, result.stderr
    sweep = json.loads(result.stdout)
    top_fields, step_fields = documented_fields()
    assert set(sweep) == top_fields
    assert (sweep["mode"], sweep["interrupted"], sweep["sessions"]) == ("concurrency", False, 4)
    assert [s["concurrency"] for s in sweep["steps"]] == [1, 4]
    for step in sweep["steps"]:
        assert set(step) == step_fields
        assert step["sessions"] == step["concurrency"] and step["request_rate"] is None
        assert step["errors"] == step["drops"] == step["unresolved"] == 0 and step["first_error"] is None
        assert step["warmup"] == 2 * step["concurrency"]
        assert 1 <= len(step["windows"]) <= 4 and step["measured_windows"] == min(3, len(step["windows"]))
        measured = step["windows"][-step["measured_windows"] :]
        assert step["completed"] == sum(w["completed"] for w in measured) > 0
        assert step["requests"] == accounted(step)
        latency = step["latency_ms"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"]
        assert step["daemon_run_ms"]["p50"] <= latency["p50"]  # the round trip holds the daemon's run
    # The daemon saw exactly the requests the sweep says it made, on 4 sessions opened once.
    found = scrape(metered.metrics_url)
    rpcs = samples(found["rknn_rpc"], "rknn_rpc_total")
    # A frame goes by Run, RunShared (a loopback caller's shared memory), an Inference stream, or is
    # rung on a doorbell (shared memory without a call: counted apart, no RPC).
    frame_methods = {"Run", "RunShared", "Inference"}
    runs = sum(v for labels, v in rpcs.items() if dict(labels)["method"] in frame_methods)
    runs += sum(samples(found["rknn_doorbell_frames"], "rknn_doorbell_frames_total").values())
    assert runs == sum(s["requests"] for s in sweep["steps"])
    assert rpcs[(("method", "InitRuntime"), ("outcome", "OK"))] == 4
    assert rpcs[(("method", "Release"), ("outcome", "OK"))] == 4


def test_the_table_and_the_csv_have_one_row_per_step(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    table = perf(cnn_model, host_daemon.url, "--concurrency", "2", *QUICK)
    assert table.returncode == 0, table.stderr
    head, *rows = table.stdout.splitlines()
    assert [c.strip() for c in head.split("|")][:2] == ["Concurrency", "Inferences/s"] and len(rows) == 1
    assert rows[0].split("|")[0].strip() == "2"
    assert "concurrency 2:" in table.stderr and "  window 1: " in table.stderr

    csv = perf(cnn_model, host_daemon.url, "--concurrency-range", "1:3", "--csv", *QUICK)
    assert csv.returncode == 0, csv.stderr
    header, *lines = csv.stdout.splitlines()
    columns = header.split(",")
    assert "latency_ms_p99" in columns and "throughput_per_s" in columns
    assert [line.split(",")[columns.index("concurrency")] for line in lines] == ["1", "2", "3"]


def test_a_slow_request_rate_is_achieved(host_daemon: DaemonProcess, cnn_model: Path) -> None:
    """10 and 20 requests/s of a model the daemon answers in a millisecond or two: the open loop must
    deliver them. Tolerances are generous: on a loaded machine a stall at a window's edge moves a few
    requests into the next window (or after the last), and a long one can fill the queue."""
    args = ["--request-rate-range", "10:20:10", "--measurement-interval", "2000", "--max-trials", "3"]
    result = perf(cnn_model, host_daemon.url, *args, "--max-in-flight", "8", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr
    sweep = json.loads(result.stdout)
    assert sweep["mode"] == "request_rate" and sweep["sessions"] == 8
    assert [s["request_rate"] for s in sweep["steps"]] == [10.0, 20.0]
    for step in sweep["steps"]:
        assert step["concurrency"] is None and len(step["windows"]) == 3
        assert step["throughput_per_s"] == pytest.approx(step["request_rate"], rel=0.3), step
        assert step["errors"] == 0 and step["drops"] <= 0.05 * step["request_rate"] * 6, step
        assert step["requests"] == accounted(step) and step["unresolved"] == 0


def test_a_rate_beyond_the_daemon_drops_requests_and_says_so(
    host_daemon: DaemonProcess, cnn_model: Path
) -> None:
    """One session cannot carry 50000 requests a second (even a shared-memory frame of this model is a
    round trip of 100 us or more; at 5000 a second, a scheduler thread slowed by a loaded machine
    could hand requests over no faster than they were answered): what cannot be sent is dropped and
    counted, and the achieved rate shows the shortfall."""
    args = ["--request-rate-range", "50000:50000", "--max-in-flight", "1", "--json", *QUICK]
    result = perf(cnn_model, host_daemon.url, *args)
    assert result.returncode == 0, result.stderr
    [step] = json.loads(result.stdout)["steps"]
    assert step["drops"] > 0 and step["throughput_per_s"] < 0.9 * 50000
    assert step["requests"] == accounted(step)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--concurrency-range", "8:1"],
            "argument --concurrency-range: END (1) is below START (8) in '8:1'; expected START:END or START:END:STEP",
        ),
        (
            ["--request-rate-range", "0:10"],
            "argument --request-rate-range: START in '0:10' must be a finite number above 0, not 0",
        ),
        (["--concurrency", "two"], "argument --concurrency: N 'two' in 'two' is not a whole number"),
        (
            ["--concurrency", "2", "--request-rate-range", "1:2"],
            "argument --request-rate-range: not allowed with argument --concurrency",
        ),
        (["--csv"], "--csv belongs to a load test: add --concurrency N"),
        (["--concurrency", "2", "--json", "--csv"], "--json and --csv both given: pick one output format"),
        (["--concurrency", "2", "--max-in-flight", "3"], "--max-in-flight is for --request-rate-range"),
        (["--concurrency", "2", "--runs", "5"], "--runs counts the single-session report's runs"),
    ],
)
def test_bad_load_options_are_refused_before_reaching_a_daemon(
    args: list[str], message: str, cnn_model: Path
) -> None:
    result = perf(cnn_model, "tcp://127.0.0.1:9", *args)  # nothing listens there: parsing must refuse first
    assert result.returncode == 2, result.stderr
    first, usage, *_ = result.stderr.splitlines()
    assert first.startswith("rknn-client perf: error: ") and message in first
    assert usage.startswith("usage: rknn-client perf ")


def test_more_sessions_than_the_daemon_allows_is_refused_with_the_limit(
    make_daemon: DaemonFactory, cnn_model: Path
) -> None:
    daemon = make_daemon("--max-sessions", "2")
    result = perf(cnn_model, daemon.url, "--concurrency-range", "1:3", *QUICK)
    assert result.returncode == 1 and result.stdout == ""
    assert (
        "concurrency 3 needs 3 sessions at once; the daemon has room for 2 (--max-sessions 2, 0 open now)"
        in result.stderr
    )


# A stability no run reaches: without an interruption the first step would take its 1000 windows.
NEVER_STABLE = ["--stability-percentage", "1e-9", "--max-trials", "1000", "--measurement-interval", "200"]


def background_perf(model: Path, device: str, *args: str) -> CliRun:
    """perf running in the background, its stderr lines read as they come."""
    return CliRun(["perf", str(model), "--device", device, "--no-progress", *args])


def test_ctrl_c_stops_cleanly_and_prints_what_was_measured(
    host_daemon: DaemonProcess, cnn_model: Path
) -> None:
    perf_run = background_perf(
        cnn_model, host_daemon.url, "--concurrency-range", "2:4", "--json", *NEVER_STABLE
    )
    perf_run.wait_for({"  window 2: "})
    perf_run.process.send_signal(signal.SIGINT)
    status, out, err = perf_run.finish(timeout=180)
    assert status == 130, err
    sweep = json.loads(out)
    assert sweep["interrupted"] is True and sweep["error"] is None
    [step] = sweep["steps"]
    assert step["concurrency"] == 2 and step["interrupted"] is True and len(step["windows"]) >= 2
    assert step["requests"] == accounted(step) and step["unresolved"] == 0
    assert "Traceback" not in err


def test_a_daemon_lost_mid_sweep_ends_it_with_what_was_measured_and_why(
    make_daemon: DaemonFactory, cnn_model: Path
) -> None:
    daemon = make_daemon()
    perf_run = background_perf(cnn_model, daemon.url, "--concurrency-range", "1:2", *NEVER_STABLE)
    perf_run.wait_for({"  window 2: "})
    daemon.stop()
    status, out, err = perf_run.finish(timeout=180)
    assert status == 1, err
    _, row = out.splitlines()
    assert row.split("|")[0].strip() == "1" and row.split("|")[-1].strip() == "failed"
    assert "rknn-client: every request of concurrency 1 failed, the sweep stopped: " in err
    assert "Traceback" not in err


def test_sessions_a_long_step_leaves_idle_are_kept_for_the_next(
    make_daemon: DaemonFactory, cnn_model: Path
) -> None:
    """The daemon expires a session idle for 2 s here; the first step runs 4 s on one session while
    the second session waits for step 2."""
    daemon = make_daemon("--session-idle-timeout", "2")
    args = ["--concurrency-range", "1:2", "--measurement-interval", "500", "--max-trials", "8"]
    result = perf(cnn_model, daemon.url, *args, "--stability-percentage", "1e-9", "--json")
    assert result.returncode == 0, result.stderr
    steps = json.loads(result.stdout)["steps"]
    assert [(s["concurrency"], s["errors"], len(s["windows"])) for s in steps] == [(1, 0, 8), (2, 0, 8)]
