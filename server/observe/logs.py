"""structlog set-up: one pipeline, JSON for machines or a console renderer for people."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

try:  # the server extra's, but on armv7l (optional, as uvloop)
    import orjson
except ImportError:  # pragma: no cover - the board images without it run the standard library's
    orjson = None  # type: ignore[assignment]

# What orjson writes natively beyond the standard library: dataclasses and datetimes go to the
# renderer's fallback (their repr) as they do there; keys that are not strings are written as text.
_ORJSON_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
    if orjson is not None
    else 0
)


def orjson_text(event: Any, default: Callable[[Any], Any]) -> str:
    """JSONRenderer's serializer where orjson is installed: the same JSON as the standard library's,
    compact, and NaN written null. An event orjson refuses (an integer beyond 64 bits, a string with
    a lone surrogate) is written by the standard library. In place in the daemon (two daemons, calls
    alternated), each call's `rpc` line took 46-57 us to render and write with json.dumps, 36-45 us
    with this."""
    try:
        return str(orjson.dumps(event, default=default, option=_ORJSON_OPTIONS), "utf-8")
    except orjson.JSONEncodeError:
        return json.dumps(event, default=default)


class IsoUtcStamper:
    """structlog's TimeStamper(fmt="iso", utc=True), with the date and time of the current second made
    once a second rather than per event: a datetime and its isoformat were a quarter of the cost of
    each call's `rpc` event. Microseconds are always written (isoformat leaves out a zero)."""

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def __call__(
        self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        now = time.time()
        second = int(now)
        cached = self._second  # one tuple, read and replaced whole: threads log too
        if cached[0] != second:
            cached = self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        event_dict["timestamp"] = f"{cached[1]}.{int((now - second) * 1e6):06d}Z"
        return event_dict


def configure(log_format: str, level: str) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(**({"serializer": orjson_text} if orjson is not None else {}))
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            IsoUtcStamper(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
