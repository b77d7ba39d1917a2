"""One call of any protocol the daemon serves, and how it is recorded when it ends: the per-method
metrics and one `rpc` log event (method, session, bytes in and out, frames answered, duration,
outcome).

The gRPC interceptor (guard.py) records every call of every gRPC service; the RKNN-Toolkit2 listener
(legacy/), which speaks no gRPC, records each of its requests the same way, so both show in the same
metrics and the same log lines.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import structlog

from rknn_server.observe.metrics import DaemonMetrics

log = structlog.get_logger("rknn_server.rpc")


class Call:
    """One call being served. Its handler fills in the session, the tensor and model bytes it
    moved and the frames it answered, as they happen; the recorder turns them into the call's
    metrics and its log event."""

    __slots__ = ("bytes_in", "bytes_out", "client", "frames", "method", "session", "start")

    def __init__(self, method: str, client: str) -> None:
        self.method = method
        self.client = client
        self.session = ""
        self.bytes_in = 0
        self.bytes_out = 0
        self.frames = 0
        self.start = time.perf_counter()


class Recorder:
    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics
        # Read once (the daemon configures logging before serving): the event is not even built when
        # info events are not logged.
        self._log = log.is_enabled_for(logging.INFO)

    def done(self, call: Call, outcome: str) -> None:
        """Record the call's end; `outcome` is its status code's name ("OK", "CANCELLED", ...).

        The duration ends and the metrics count here. The `rpc` line is written when the event loop
        next runs its ready callbacks (in the call's context, so with its client), after the reply
        this call ends with has been handed to the transport: rendering and writing it (36-45 us in
        place as JSON, about 60 as console text) is then not part of the caller's wait."""
        seconds = time.perf_counter() - call.start
        self.metrics.rpc_done(call.method, outcome, seconds, call.bytes_in, call.bytes_out)
        if self._log:
            line = functools.partial(
                log.info,
                "rpc",
                method=call.method,
                session=call.session[:12] or None,
                bytes_in=call.bytes_in,
                bytes_out=call.bytes_out,
                frames=call.frames or None,
                duration_ms=round(seconds * 1000, 3),
                outcome=outcome,
            )
            asyncio.get_running_loop().call_soon(line)


__all__ = ["Call", "Recorder"]
