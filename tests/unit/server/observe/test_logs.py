"""The log pipeline: its own timestamper (what structlog's ISO UTC one writes, made once a second)
and its JSON lines (orjson's where it is installed, reading back as the standard library's)."""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

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


@dataclass
class _Limits:
    max_rank: int


def _lines(events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The JSON lines the daemon's configured pipeline writes for `events`."""
    sink = io.StringIO()
    monkeypatch.setattr(logs.sys, "stderr", sink)
    try:
        logs.configure("json", "info")
        for event in events:
            structlog.get_logger("test").info("rpc", **event)
    finally:
        structlog.reset_defaults()
    return sink.getvalue().splitlines()


@pytest.mark.skipif(logs.orjson is None, reason="orjson is not installed here (armv7l)")
def test_json_lines_are_written_by_orjson_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson writes compact JSON: the standard library's json.dumps writes ", " and ": "."""
    (line,) = _lines([{"method": "Run", "bytes_in": 16}], monkeypatch)
    assert line.startswith('{"method":"Run","bytes_in":16,"event":"rpc"')


def test_without_orjson_the_standard_library_writes_the_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """armv7l has no orjson wheels: its daemon writes json.dumps's lines."""
    monkeypatch.setattr(logs, "orjson", None)
    (line,) = _lines([{"method": "Run", "bytes_in": 16}], monkeypatch)
    assert line.startswith('{"method": "Run", "bytes_in": 16, "event": "rpc"')


@pytest.mark.parametrize("with_orjson", [True, False], ids=["orjson", "standard library"])
def test_json_lines_read_back_as_the_standard_library_writes_them(
    monkeypatch: pytest.MonkeyPatch, with_orjson: bool
) -> None:
    """Whichever writer wrote it, a line reads back as the event: values JSON has no type for are
    their repr (a dataclass, a datetime, an object), keys become text, and what orjson refuses (an
    integer beyond 64 bits, a lone surrogate) is still written."""
    if not with_orjson:
        monkeypatch.setattr(logs, "orjson", None)
    elif logs.orjson is None:
        pytest.skip("orjson is not installed here (armv7l)")
    when = datetime(2026, 12, 8, tzinfo=timezone.utc)
    events: list[dict[str, Any]] = [
        {"limits": _Limits(8), "when": when, "counts": {1: "one"}, "text": "naïve ☃"},
        {"size": 2**70, "name": "\ud800"},
        {"thing": (marker := object())},
    ]
    first, second, third = (json.loads(line) for line in _lines(events, monkeypatch))
    assert first["limits"] == "_Limits(max_rank=8)" and first["when"] == repr(when)
    assert first["counts"] == {"1": "one"} and first["text"] == "naïve ☃"
    assert second["size"] == 2**70 and second["name"] == "\ud800"
    assert third["thing"] == repr(marker)
