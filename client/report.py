"""Reports in RKNN-Toolkit2's text formats, so scripts that parse the toolkit's printouts keep working."""

from __future__ import annotations

from collections import defaultdict

from rknn_client.timing import Latency
from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse

_RULE = "=" * 54
_SDK_RULE = "=" * 46
# Column order of the toolkit's per-layer table; backend-specific columns go before FullName.
_LAYER_HEAD = ("ID", "OpType", "DataType", "Target", "InputShape", "OutputShape")
_RANK_HEAD = (
    "OpType",
    "CallNumber",
    "CPUTime(us)",
    "GPUTime(us)",
    "NPUTime(us)",
    "TotalTime(us)",
    "TimeRatio(%)",
)
_FREQ_ORDER = ("CPU", "NPU", "DDR")


def table_lines(rows: list[list[str]]) -> list[str]:
    """Rows of cells joined by ` | ` as the toolkit does, each column padded to its widest cell (scripts
    that split on `|` and strip keep working)."""
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(map(len, rows)))]
    return [" | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _us(value: float) -> str:
    return str(round(value))


def frequency_text(report: EvalPerfResponse) -> str:
    lines = []
    by_kind = {f.kind: f.values for f in report.frequencies}
    for kind in _FREQ_ORDER:
        values = by_kind.get(kind)
        if values:
            lines.append(f"{kind} Current Frequency List:")
            lines.extend(f"  - {v}" for v in values)
    if report.frequency_note:
        lines.append(report.frequency_note)
    return "\n".join(lines)


def layer_table(report: EvalPerfResponse) -> str:
    extras = list(report.extra_columns)
    rows = [[*_LAYER_HEAD, "Time(us)", *extras, "FullName"]]
    for r in report.layers:
        cells = [
            str(r.index),
            r.op_type,
            r.data_type,
            r.target,
            ",".join(r.input_shapes) or "\\",
            r.output_shape or "\\",
            _us(r.time_us),
            *[r.extra.get(c, "\\") for c in extras],
            r.name,
        ]
        rows.append(cells)
    lines = ["Network Layer Information Table", *table_lines(rows), ""]
    lines.append(f"Total Operator Elapsed Per Frame Time(us): {_us(report.total_operator_time_us)}")
    # Runtimes that do not measure memory traffic report 0: a figure nobody measured is left out.
    if report.total_rw_kb > 0:
        lines.append(f"Total Memory Read/Write Per Frame Size(KB): {report.total_rw_kb:.1f}")
    return "\n".join(lines)


def ranking_table(report: EvalPerfResponse) -> str:
    per_op: dict[str, dict[str, float]] = defaultdict(
        lambda: {"calls": 0, "CPU": 0.0, "GPU": 0.0, "NPU": 0.0}
    )
    for r in report.layers:
        entry = per_op[r.op_type]
        entry["calls"] += 1
        entry[r.target if r.target in ("CPU", "GPU", "NPU") else "CPU"] += r.time_us
    total = sum(r.time_us for r in report.layers) or 1.0
    ranked = sorted(per_op.items(), key=lambda kv: -(kv[1]["CPU"] + kv[1]["GPU"] + kv[1]["NPU"]))
    rows = [list(_RANK_HEAD)]
    for op, e in ranked:
        op_total = e["CPU"] + e["GPU"] + e["NPU"]
        rows.append(
            [
                op,
                str(int(e["calls"])),
                _us(e["CPU"]),
                _us(e["GPU"]),
                _us(e["NPU"]),
                _us(op_total),
                f"{op_total / total * 100:.2f}%",
            ]
        )
    return "\n".join(["Operator Time Consuming Ranking Table", *table_lines(rows)])


def _totals_note(report: EvalPerfResponse, latency: Latency | None) -> str:
    """How Total Time relates to the per-layer table printed above it, so the two are never read as
    one measurement when they are not, and the gap between them is stated when they are."""
    if latency is not None:
        return (
            "(Total Time: the median of the timed runs below; the per-layer times: the runtime's "
            "profiled run(s), adding up to Total Operator Elapsed Per Frame Time)"
        )
    gap = report.total_time_us - report.total_operator_time_us
    between = (
        f"{_us(gap)} us of it outside the layers (the runtime's own work between them)"
        if gap >= 0
        else f"the layers overlap: they add up to {_us(-gap)} us more"
    )
    return (
        "(Total Time: the same profiled run(s) as the per-layer times, which add up to Total Operator "
        f"Elapsed Per Frame Time; {between}; without perf_debug, runs are timed without the profiler)"
    )


def perf_text(report: EvalPerfResponse, latency: Latency | None = None, measured_on: str = "") -> str:
    """The eval_perf report: frequencies, then the per-layer tables or the total alone. With `latency`
    (many timed runs), Total Time is their median and the spread follows; `measured_on` (where the
    figures come from, when that is not a board) heads the block."""
    parts = [frequency_text(report)] if report.frequencies or report.frequency_note else []
    if report.layers:
        parts += [layer_table(report), ranking_table(report)]
    total = latency.p50_us if latency is not None else report.total_time_us
    fps = 1e6 / total if total > 0 else 0.0
    block = [
        _RULE,
        "                 Performance",
        *([f"Measured on: {measured_on}"] if measured_on else []),
        _RULE,
        f"Total Time(us): {_us(total)}",
        f"FPS: {fps:.2f}",
    ]
    if report.layers:
        block.append(_totals_note(report, latency))
    if latency is not None:
        stopped = " (stopped by Ctrl-C)" if latency.interrupted else ""
        block += [
            f"Runs: {latency.runs} timed after {latency.warmup} warm-up{stopped} "
            "(the daemon's run time per frame)",
            f"Latency(us): p50 {_us(latency.p50_us)}  p90 {_us(latency.p90_us)}  p99 {_us(latency.p99_us)}"
            f"  min {_us(latency.min_us)}  max {_us(latency.max_us)}",
            f"Round trip from this PC(us): p50 {_us(latency.round_trip_p50_us)}",
        ]
    parts.append("\n".join([*block, _RULE]))
    if report.raw_text:
        parts.append(report.raw_text.rstrip())
    return "\n\n".join(p for p in parts if p) + "\n"


def readable_size(n: int) -> str:
    """A byte count as people read it: `8 MiB`, `1.5 GiB`, `512 B`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_bytes(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 10):.2f} KiB"


def memory_text(report: EvalMemoryResponse, measured_on: str = "") -> str:
    """The eval_memory report; `measured_on` as in perf_text."""
    return (
        "\n".join(
            [
                _RULE,
                "      Memory Profile Info Dump",
                *([f"Measured on: {measured_on}"] if measured_on else []),
                _RULE,
                "NPU model memory detail(bytes):",
                f"  Weight Memory: {human_bytes(report.weight_memory)}",
                f"  Internal Tensor Memory: {human_bytes(report.internal_memory)}",
                f"  Other Memory: {human_bytes(report.other_memory)}",
                f"  Total Memory: {human_bytes(report.total_memory)}",
                "",
                "INFO: When evaluating memory usage, we need consider",
                f"the size of model, current model size is: {human_bytes(report.model_size)}",
                _RULE,
            ]
        )
        + "\n"
    )


def sdk_version_text(api: str, server: str, runtime: str) -> str:
    return (
        "\n".join(
            [
                _SDK_RULE,
                "RKNN VERSION:",
                f"API: {api}",
                f"DRV: rknn_server: {server}",
                f"DRV: rknnrt: {runtime}",
                _SDK_RULE,
            ]
        )
        + "\n"
    )


def devices_text(adb_devices: list[str], ntb_devices: list[str]) -> str:
    stars = "*" * 25
    if not adb_devices and not ntb_devices:
        return f"{stars}\nNone devices connected.\n{stars}\n"
    lines = [stars]
    if adb_devices:
        lines += ["all device(s) with adb mode:", ",".join(adb_devices)]
    if ntb_devices:
        lines += ["all device(s) with ntb mode:", ",".join(ntb_devices)]
    lines.append(stars)
    return "\n".join(lines) + "\n"
