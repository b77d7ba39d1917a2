"""When a call's record is made (calls.Recorder): its metrics as the call ends, its `rpc` line only
once the event loop is free again, so that writing it is not part of the caller's wait, and with
the identity of the call it belongs to, whatever the next call binds."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from structlog.contextvars import bind_contextvars, merge_contextvars
from structlog.testing import capture_logs

from rknn_server.observe.calls import Call, Recorder
from rknn_server.observe.metrics import DaemonMetrics


def _rpc_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "rpc"]


def test_the_rpc_line_follows_the_call_and_keeps_its_client() -> None:
    metrics = DaemonMetrics()
    seen: dict[str, object] = {}

    async def scenario(logs: list[dict[str, Any]]) -> None:
        recorder = Recorder(metrics)
        bind_contextvars(client="uid:1000")
        call = Call("Run", "uid:1000")
        call.session, call.bytes_in, call.bytes_out, call.frames = "0123456789abcdef", 16, 8, 1
        recorder.done(call, "OK")
        seen["lines_at_end"] = len(_rpc_lines(logs))
        seen["counted_at_end"] = metrics.registry.get_sample_value(
            "rknn_rpc_total", {"method": "Run", "outcome": "OK"}
        )
        bind_contextvars(client="uid:2000")  # what the loop's next call would bind
        await asyncio.sleep(0)

    structlog.contextvars.clear_contextvars()
    with capture_logs(processors=[merge_contextvars]) as logs:
        asyncio.run(scenario(logs))
    assert seen == {"lines_at_end": 0, "counted_at_end": 1.0}
    (line,) = _rpc_lines(logs)
    assert line["client"] == "uid:1000" and line["method"] == "Run" and line["outcome"] == "OK"
    assert (line["session"], line["bytes_in"], line["bytes_out"], line["frames"]) == (
        "0123456789ab",
        16,
        8,
        1,
    )
    structlog.contextvars.clear_contextvars()
