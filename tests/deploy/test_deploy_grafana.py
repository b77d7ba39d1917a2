"""The Grafana dashboard: valid JSON whose queries name only metrics a live daemon exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_files import DEPLOY
from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.conftest import get, start_metrics_daemon, telemetry_board

DASHBOARD = DEPLOY / "grafana" / "rknn-server.json"
# Series names each metric type puts in the exposition.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or"}
PROMQL_WORDS |= {"unless", "inf", "nan"}
_DROP = re.compile(
    r'"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]|\$\w+|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)'
)
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels, strings or variables)."""
    rest = _DROP.sub(" ", expr)
    found = set()
    for match in _NAME.finditer(rest):
        before, after = rest[: match.start()], rest[match.end() :].lstrip()
        if before and (before[-1].isalnum() or before[-1] in "_."):
            continue  # inside a number such as 0.95 or 1e3
        if not after.startswith("(") and match.group().lower() not in PROMQL_WORDS:
            found.add(match.group())
    return found


def queries(dashboard: dict[str, Any]) -> Iterator[str]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert match, f"unexpected variable query {query['query']}"
            yield match.group(1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every series name a daemon with all telemetry sources exports."""
    folder = tmp_path_factory.mktemp("grafana")
    running = start_metrics_daemon(folder, "--sysfs-root", str(telemetry_board(folder / "board")))
    try:
        status, body = get(running.metrics_url)
    finally:
        running.daemon.stop()
    assert status == 200
    families = text_string_to_metric_families(body.decode())
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, method) (rate(rknn_rpc_duration_seconds_bucket{instance=~"$i", '
        'outcome!="OK"}[$__rate_interval]))) / on(instance) rknn_memory_total_bytes + 1e3'
    )
    assert metric_names(expr) == {"rknn_rpc_duration_seconds_bucket", "rknn_memory_total_bytes"}


def test_dashboard_queries_name_only_exported_metrics(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    named = {name for expr in queries(dashboard) for name in metric_names(expr)}
    assert named, "the dashboard has no queries"
    assert named <= exported, f"not exported by the daemon: {sorted(named - exported)}"
    # The key metrics each have a panel.
    for key in (
        "rknn_rpc_total",
        "rknn_rpc_duration_seconds_bucket",
        "rknn_model_compute_seconds_bucket",
        "rknn_model_queue_seconds_bucket",
        "rknn_inflight_calls",
        "rknn_npu_load_ratio",
        "rknn_temperature_celsius",
    ):
        assert key in named, f"no panel shows {key}"


def test_dashboard_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(Path(DASHBOARD).read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
