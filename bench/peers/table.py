"""The peers row as a readable table: each server's medians, then the peer/ours ratios."""

from __future__ import annotations

from typing import Any

FIGURES = (  # (concurrency, figure, heading, format)
    ("c1", "p50_ms", "c1 p50 ms", "{:.2f}"),
    ("c1", "p99_ms", "c1 p99 ms", "{:.2f}"),
    ("c1", "server_cpu_s_per_1000_requests", "c1 CPU s/1k", "{:.2f}"),
    ("c8", "throughput_rps", "c8 req/s", "{:.0f}"),
    ("c8", "p50_ms", "c8 p50 ms", "{:.2f}"),
    ("c8", "server_cpu_s_per_1000_requests", "c8 CPU s/1k", "{:.2f}"),
    ("c8", "server_rss_peak_mib", "c8 RSS MiB", "{:.0f}"),
)
RATIOS = (
    ("c1 p50_ms", "c1 p50"),
    ("c1 server_cpu_s_per_1000_requests", "c1 CPU/req"),
    ("c8 p50_ms", "c8 p50"),
    ("c8 throughput_rps", "c8 req/s"),
    ("c8 server_cpu_s_per_1000_requests", "c8 CPU/req"),
    ("c8 server_rss_peak_mib", "c8 RSS"),
)


def _ratio(found: dict[str, float] | None) -> str:
    if not found:
        return "-"
    return f"{found['median']:.2f} [{found['min']:.2f}-{found['max']:.2f}]"


def render(result: dict[str, Any]) -> str:
    lines = [
        f"peers: medians of {result['rounds']} rounds, servers up together and measured side by side, window after window, orders rotated; "
        f"{result['seconds_per_window']:.1f} s a window; CPU s/1k = server CPU seconds per 1000 requests "
        "(its whole process tree)"
    ]
    for name, about in result["servers"].items():
        lines.append(
            f"  {name}: {about.get('skipped') or about.get('what', '')}{'; ' + about['note'] if about.get('note') else ''}"
        )
    for model, label in result["models"].items():
        lines += ["", label, f"{'server door':<26}" + "".join(f"{h:>12}" for _, _, h, _ in FIGURES)]
        for server, doors in result["figures"].items():
            for door, by_model in doors.items():
                cells = by_model.get(model, {})
                row = [
                    fmt.format(cells[c][key]) if key in cells.get(c, {}) else "-"
                    for c, key, _, fmt in FIGURES
                ]
                lines.append(f"{server + ' ' + door:<26}" + "".join(f"{v:>12}" for v in row))
    lines += [
        "",
        "peer/ours ratios, median [min-max] of the rounds (above 1: the peer is slower or costlier, but for req/s)",
    ]
    for model, label in result["models"].items():
        lines += [label, f"{'pair':<44}" + "".join(f"{h:>20}" for _, h in RATIOS)]
        for pair, figures in result["ratios_peer_over_ours"].get(model, {}).items():
            lines.append(f"{pair:<44}" + "".join(f"{_ratio(figures.get(key)):>20}" for key, _ in RATIOS))
    starts = result["start_to_ready_s"]
    lines += [
        "",
        "start-to-ready s (every bench model ready), median of the rounds: "
        + ", ".join(f"{n} {s['median']:.2f}" for n, s in starts.items() if s),
    ]
    lines += _daemon_lines(result.get("daemon", {})) + _batching_lines(result.get("dynamic_batching", {}))
    if result["errors"]:
        lines += ["", "failures:", *(f"  {e[:300]}" for e in result["errors"])]
    return "\n".join(lines)


def _daemon_lines(daemon: dict[str, Any]) -> list[str]:
    lines = []
    start = daemon.get("start_to_ready", {})
    if "median_s" in start:
        lines.append(
            f"our daemon alone, no model: start to listening {start['median_s']:.2f} s (median of {start['starts']})"
        )
    restart = daemon.get("restart_to_ready", {})
    if "restart_median_s" in restart:
        lines.append(
            f"our daemon with tiny and MobileNetV2: start to ready {restart['first_median_s']:.2f} s over an empty cache, "
            f"{restart['restart_median_s']:.2f} s restarted over it (restart/first {_ratio(restart['restart_over_first'])}, "
            f"median of {restart['starts']})"
        )
    rss = daemon.get("rss_per_session", {})
    if "rss_per_extra_session_mib" in rss:
        lines.append(
            f"our daemon's RSS: idle {rss['rss_idle_mib']:.0f} MiB, first MobileNetV2 session +{rss['rss_first_session_mib']:.1f} MiB, "
            f"each of {rss['extra_callers']} more +{rss['rss_per_extra_session_mib']:.1f} MiB "
            f"({rss['rss_per_extra_session_over_model_file']:.2f}x the {rss['model_file_mib']:.1f} MiB file)"
        )
    lines += [
        f"our daemon's costs: {k}: {v}" for k, v in daemon.items() if isinstance(v, dict) and "error" in v
    ]
    return lines


def _batching_lines(found: dict[str, Any]) -> list[str]:
    if "throughput_batched_over_plain" not in found:
        return (
            [f"dynamic batching: {found.get('skipped') or found.get('error', 'not measured')}"[:600]]
            if found
            else []
        )
    rps, p50 = found["throughput_rps"], found["p50_ms"]
    return [
        f"dynamic batching (perf_analyzer c{found['concurrency']}, MobileNetV2, ours v2 gRPC): "
        f"{rps['batched']:.1f} vs {rps['plain']:.1f} req/s, p50 {p50['batched']:.1f} vs {p50['plain']:.1f} ms; "
        f"batched/plain throughput {_ratio(found['throughput_batched_over_plain'])}, p50 {_ratio(found['p50_batched_over_plain'])}"
    ]
