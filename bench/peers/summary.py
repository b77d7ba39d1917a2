"""From the rounds to the figures the issue asks for: each server's medians over the rounds, and
peer/ours ratios per round, reported as their median with the spread (min, max) of the rounds.
Only ratios of figures taken in the same round are formed: the machine changes between rounds."""

from __future__ import annotations

import statistics
from typing import Any

# (concurrency, figure) pairs compared: latency and CPU at both, throughput and RSS at eight.
COMPARED = (
    ("c1", "p50_ms"),
    ("c1", "p99_ms"),
    ("c1", "server_cpu_s_per_1000_requests"),
    ("c8", "p50_ms"),
    ("c8", "throughput_rps"),
    ("c8", "server_cpu_s_per_1000_requests"),
    ("c8", "server_rss_peak_mib"),
)
# Each peer door against ours: the same protocol, and its gRPC against our own rknn.v1 wire.
AGAINST = {"v2_grpc": ("v2_grpc", "rknn_v1"), "v2_rest": ("v2_rest",), "v2_rest_json": ("v2_rest_json",)}


def _cell(round_: dict[str, Any], server: str, door: str, model: str, concurrency: str) -> dict[str, Any]:
    found = round_.get(server, {}).get("figures", {}).get(door, {}).get(model, {}).get(concurrency, {})
    return found if "error" not in found else {}


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": len(values),
    }


def medians(
    rounds: list[dict[str, Any]], servers: dict[str, tuple[str, ...]], models: list[str]
) -> dict[str, Any]:
    """{server: {door: {model: {"c1": {figure: median}, ...}}}} over the rounds it was measured in."""
    out: dict[str, Any] = {}
    for server, doors in servers.items():
        for door in doors:
            for model in models:
                for concurrency in ("c1", "c8"):
                    cells = [c for r in rounds if (c := _cell(r, server, door, model, concurrency))]
                    if cells:
                        out.setdefault(server, {}).setdefault(door, {}).setdefault(model, {})[concurrency] = {
                            key: statistics.median(c[key] for c in cells) for key in cells[0]
                        }
    return out


def ratios(
    rounds: list[dict[str, Any]], servers: dict[str, tuple[str, ...]], models: list[str]
) -> dict[str, Any]:
    """{model: {"PEER DOOR / ours DOOR": {"c1 p50_ms": spread, ...}}}: peer over ours, per round."""
    out: dict[str, Any] = {}
    for model in models:
        for peer, doors in servers.items():
            if peer == "ours":
                continue
            for door in doors:
                for ours in AGAINST[door]:
                    pair: dict[str, Any] = {}
                    for concurrency, figure in COMPARED:
                        values = []
                        for r in rounds:
                            theirs, mine = (
                                _cell(r, peer, door, model, concurrency),
                                _cell(r, "ours", ours, model, concurrency),
                            )
                            if theirs and mine and mine[figure]:
                                values.append(theirs[figure] / mine[figure])
                        pair[f"{concurrency} {figure}"] = spread(values)
                    out.setdefault(model, {})[f"{peer} {door} / ours {ours}"] = pair
    return out


def start_times(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each server's start-to-ready seconds (every bench model ready), median and spread of its starts."""
    names = {name for r in rounds for name in r}
    return {
        name: spread([r[name]["start_s"] for r in rounds if "start_s" in r.get(name, {})])
        for name in sorted(names)
    }


def errors(rounds: list[dict[str, Any]]) -> list[str]:
    """Every failure of the rounds, said once each (a peer that cannot start says so every round)."""
    found: list[str] = []
    for number, r in enumerate(rounds, 1):
        for server, result in r.items():
            if "error" in result:
                found.append(f"round {number}: {server}: {result['error']}")
            for door, by_model in result.get("figures", {}).items():
                for model, by_c in by_model.items():
                    for concurrency, cell in by_c.items():
                        if "error" in cell:
                            found.append(
                                f"round {number}: {server} {door} {model} {concurrency}: {cell['error']}"
                            )
    return found
