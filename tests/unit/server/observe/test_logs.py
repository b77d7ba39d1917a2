"""The log pipeline's own timestamper: what structlog's ISO UTC one writes, made once a second."""

from __future__ import annotations

import io
import json
import time
from datetime import datetime, timezone

import pytest
import structlog

from rknn_server.observe import logs


def test_stamps_are_iso_utc_with_microseconds_and_follow_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    stamper = logs.IsoUtcStamper()
    clock = iter([1_700_000_000.000000, 1_700_000_000.25, 1_700_000_001.5, 1_700_000_059.999999])
    monkeypatch.setattr(logs.time, "time", lambda: next(clock))
    stamps = [stamper(None, "info", {})["timestamp"] for _ in range(4)]
    assert stamps == [
        "2023-11-14T22:13:20.000000Z",
        "2023-11-14T22:13:20.250000Z",
        "2023-11-14T22:13:21.500000Z",  # a new second: its date and time made afresh
        "2023-11-14T22:14:19.999999Z",
    ]


def test_a_stamp_is_the_time_structlog_would_have_written() -> None:
    before = datetime.now(tz=timezone.utc)
    stamp = logs.IsoUtcStamper()(None, "info", {})["timestamp"]
    after = datetime.now(tz=timezone.utc)
    assert stamp.endswith("Z")
    assert before <= datetime.fromisoformat(stamp.removesuffix("Z") + "+00:00") <= after


def test_configured_json_lines_carry_the_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = io.StringIO()
    monkeypatch.setattr(logs.sys, "stderr", sink)
    try:
        logs.configure("json", "info")
        structlog.get_logger("test").info("rpc", outcome="OK")
        line = json.loads(sink.getvalue().splitlines()[-1])
    finally:
        structlog.reset_defaults()
    assert line["event"] == "rpc" and line["outcome"] == "OK" and line["level"] == "info"
    assert (
        abs(datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp() - time.time()) < 60
    )
