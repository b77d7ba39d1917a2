"""structlog set-up: one pipeline, JSON for machines or a console renderer for people."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import structlog


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
        structlog.processors.JSONRenderer()
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
