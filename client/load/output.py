"""A sweep's results as a table (one row per step, in the perf report's `|` layout), as JSON and as
CSV. The JSON fields are documented in docs/metrics-and-inference-protocol.md (Load testing)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import asdict

from rknn_client.load.drivers import Step, Sweep
from rknn_client.load.windows import Kind, Percentiles, Summary, Window
from rknn_client.report import table_lines


def _number(value: float) -> float | None:
    """NaN (nothing completed, so no latency) is null in JSON and empty in CSV."""
    return None if math.isnan(value) else round(value, 4)


def _percentiles(p: Percentiles) -> dict[str, float | None]:
    return {k: _number(v) for k, v in asdict(p).items()}


def _window(window: Window) -> dict[str, object]:
    return {
        "duration_s": round(window.duration_s, 4),
        "completed": window.completed,
        "errors": window.count(Kind.ERROR),
        "drops": window.count(Kind.DROP),
        "throughput_per_s": round(window.throughput, 4),
        "latency_ms": _percentiles(Percentiles.of(window.latencies_s).scaled(1e3)),
    }


def step_json(step: Step) -> dict[str, object]:
    """One step: its figures over the measured (last, at most 3) windows, every window, and the
    accounting of its requests: requests = warmup + the windows' outcomes + after_windows + unresolved."""
    s = Summary.of(step.windows)
    return {
        "concurrency": step.concurrency,
        "request_rate": step.rate,
        "sessions": step.sessions,
        "stable": step.stable,
        "interrupted": step.interrupted,
        "failed": step.failed,
        "throughput_per_s": round(s.throughput, 4),
        "latency_ms": _percentiles(s.latency_ms),
        "daemon_run_ms": _percentiles(s.server_ms),
        "completed": s.completed,
        "errors": s.errors,
        "drops": s.drops,
        "measured_windows": s.windows,
        "windows": [_window(w) for w in step.windows],
        "requests": step.requests,
        "warmup": len(step.warmup),
        "after_windows": len(step.after),
        "unresolved": step.unresolved,
        "first_error": step.first_error,
    }


def _flat(record: dict[str, object]) -> dict[str, object]:
    """A step's JSON as one CSV row: `latency_ms.p50` becomes `latency_ms_p50`, the windows their count."""
    row: dict[str, object] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            row.update({f"{key}_{sub}": v for sub, v in value.items()})
        else:
            row[key] = len(value) if isinstance(value, list) else value
    return row


def csv_text(steps: Sequence[Step]) -> str:
    """A header, then one row per step: the fields of the JSON, flattened."""
    out = io.StringIO()
    writer = csv.DictWriter(out, list(_flat(step_json(Step()))), lineterminator="\n")
    writer.writeheader()
    writer.writerows(_flat(step_json(step)) for step in steps)
    return out.getvalue()


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _state(step: Step) -> str:
    return "interrupted" if step.interrupted else "failed" if step.failed else "yes" if step.stable else "no"


def table_text(steps: Sequence[Step], open_loop: bool) -> str:
    head = ["Rate/s", "Achieved/s"] if open_loop else ["Concurrency", "Inferences/s"]
    rows = [[*head, "p50 ms", "p90 ms", "p99 ms", "Daemon p50 ms", "Completed", "Errors", "Drops", "Stable"]]
    for step in steps:
        s = Summary.of(step.windows)
        rows.append(
            [
                f"{step.rate:g}" if open_loop else str(step.concurrency),
                f"{s.throughput:.2f}",
                _ms(s.latency_ms.p50),
                _ms(s.latency_ms.p90),
                _ms(s.latency_ms.p99),
                _ms(s.server_ms.p50),
                str(s.completed),
                str(s.errors),
                str(s.drops),
                _state(step),
            ]
        )
    return "\n".join(table_lines(rows)) + "\n"


def step_name(step: Step) -> str:
    return f"rate {step.rate:g}/s" if step.rate is not None else f"concurrency {step.concurrency}"


def window_line(number: int, window: Window) -> str:
    """perf_analyzer's `Pass [n]` line: what one window saw."""
    latency = Percentiles.of(window.latencies_s).scaled(1e3)
    return (
        f"  window {number}: {window.throughput:.2f} inferences/s, p50 {_ms(latency.p50)} ms, "
        f"{window.count(Kind.ERROR)} errors, {window.count(Kind.DROP)} drops"
    )


def progress_line(step: Step) -> str:
    """One line on stderr as each step ends, so a long sweep shows it is alive."""
    s = Summary.of(step.windows)
    how = f"{len(step.windows)} windows, " + ("stable" if step.stable else "not stable")
    return (
        f"{step_name(step)}: {s.throughput:.2f} inferences/s, p50 {_ms(s.latency_ms.p50)} ms, "
        f"p99 {_ms(s.latency_ms.p99)} ms, {s.errors} errors, {s.drops} drops ({how})"
    )


def sweep_json(sweep: Sweep) -> dict[str, object]:
    settings = sweep.settings
    return {
        "mode": "request_rate" if sweep.open_loop else "concurrency",
        "measurement_interval_ms": round(settings.interval_s * 1000),
        "stability_percentage": settings.stability_percent,
        "max_trials": settings.max_windows,
        "warmup_per_session": settings.warmup,
        "sessions": sweep.sessions,
        "interrupted": sweep.interrupted,
        "error": sweep.error,
        "steps": [step_json(step) for step in sweep.steps],
    }


def sweep_text(sweep: Sweep) -> str:
    return table_text(sweep.steps, sweep.open_loop)
