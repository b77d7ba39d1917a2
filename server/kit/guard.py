"""The one interceptor in front of every RPC of every service on the daemon's gRPC server.

For each call it admits the caller (auth.AccessPolicy: token, certificate, loopback rule), counts the
call against the in-flight limits, checks the client's protocol version (rknn.v1 methods only) and
bounds idle request streams. When the call ends it records it once (calls.py: the metrics, one `rpc`
log event) and ends a failed one with its status (errors.status_of: a ServiceError's own code and
message, an unexpected exception as INTERNAL with a reference id whose detail is logged), the error's
reason and hints as trailing metadata. Handlers are left with protobuf translation: they raise, and
they report the session and bytes of their call on `current_call()`.

It wraps each method's handler rather than filtering in the interceptor proper, because only the
servicer context knows the peer and the TLS certificate. Health and reflection stay open (and
unrecorded) so that probes work without credentials.

In-flight calls are capped in total (--max-inflight-requests) and per client identity
(--max-inflight-per-client), so that one client's idle streams cannot lock others out. A Reserve
that waits for the board holds nothing but a timer, so it counts against its client's own cap only,
never the shared one. Every request stream must deliver its next message within
--stream-idle-timeout, else the call ends with DEADLINE_EXCEEDED and drops what it had buffered.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import aclosing
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog

from rknn_proto import rknn_pb2
from rknn_proto.framing import TruncatedFrame
from rknn_proto.reasons import Reason
from rknn_proto.version import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, PROTOCOL_VERSION_METADATA_KEY
from rknn_server.config.limits import Limits
from rknn_server.errors import (
    FailedPrecondition,
    ResourceExhausted,
    ServiceError,
    StreamIdle,
    error_metadata,
    expected_status,
    status_of,
)
from rknn_server.kit.auth import AccessPolicy, Unauthenticated, bearer_token
from rknn_server.observe.calls import Call, Recorder
from rknn_server.observe.metrics import DaemonMetrics

_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# Methods whose callers speak this daemon's protocol version (metadata rknn-protocol-version).
_VERSIONED_PREFIX = f"/{rknn_pb2.DESCRIPTOR.package}."
# Calls that may wait long for a shared resource without holding any: outside the shared cap.
_WAITING_SUFFIXES = ("/Reserve",)
_V2_PREFIX = "/inference."  # KServe v2's package (server/kserve)
# How long a request stream that ended inside a frame (or failed unexpectedly) waits for its
# cancellation to show, and how often it looks.
CANCEL_GRACE_S = 1.0
CANCEL_POLL_S = 0.01
Context = grpc.aio.ServicerContext
Metadata = Iterable[tuple[str, Any]]
Codecs = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]


def serialized(reply: bytes) -> bytes:
    """The response serializer of a handler that serializes its replies itself (a codec's)."""
    return reply


T = TypeVar("T")

log = structlog.get_logger("rknn_server.guard")
_CALL: ContextVar[Call] = ContextVar("rknn_call")


def current_call() -> Call:
    """The RPC being served (LookupError outside one: a handler runs behind the interceptor)."""
    return _CALL.get()


def client_identity() -> str:
    """The identity of the caller whose RPC is being served (empty outside an RPC)."""
    call = _CALL.get(None)
    return call.client if call is not None else ""


@dataclass(frozen=True)
class _Method:
    """What the interceptor needs to know of one method, worked out once."""

    name: str  # the short name, as in metrics and logs ("Run")
    shared: bool  # counts against the shared in-flight cap
    versioned: bool  # an rknn.v1 method: the client's protocol version is checked

    @classmethod
    def of(cls, path: str) -> _Method:
        name = path.rsplit("/", 1)[-1]
        if path.startswith(_V2_PREFIX):
            name = f"v2.{name}"  # KServe v2 beside rknn.v1's own names, as in the v2 REST routes' records
        return cls(name, not path.endswith(_WAITING_SUFFIXES), path.startswith(_VERSIONED_PREFIX))


def _certificate_subject(context: Context) -> str:
    auth = context.auth_context() or {}
    for key in ("x509_subject", "x509_common_name"):
        values = list(auth.get(key) or ())
        if values:
            value = values[0]
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return ""


def check_protocol_version(metadata: Metadata) -> None:
    """Refuse a client older than this daemon supports (a client that sends no version is let in)."""
    version = next((v for k, v in metadata if k == PROTOCOL_VERSION_METADATA_KEY), None)
    if version is not None and (not str(version).isdigit() or int(version) < MIN_PROTOCOL_VERSION):
        raise FailedPrecondition(
            f"client protocol version {version} is older than this daemon supports "
            f"(daemon {PROTOCOL_VERSION}, oldest client {MIN_PROTOCOL_VERSION}); upgrade rknn_client",
            reason=Reason.PROTOCOL_TOO_OLD,
        )


async def idle_limited(requests: AsyncIterator[T], timeout_s: float) -> AsyncIterator[T]:
    """The request stream, each message of which must arrive within timeout_s of asking for it."""
    iterator = requests.__aiter__()
    while True:
        try:
            message = await asyncio.wait_for(iterator.__anext__(), timeout_s)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise StreamIdle(
                f"the request stream sent nothing for {timeout_s:g} s (the limit stream_idle_timeout_s="
                f"{timeout_s:g}, --stream-idle-timeout); the call was ended and its buffers dropped"
            ) from None
        yield message


def _aborted_code(context: Context) -> str:
    """The status a handler's own context.abort set."""
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


class Guard(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        access: AccessPolicy,
        limits: Limits,
        metrics: DaemonMetrics,
        codecs: Mapping[str, Codecs] | None = None,
    ) -> None:
        self.access = access
        # Methods whose handlers read and write wire bytes themselves (RknnService.CODECS): path ->
        # (request deserializer, response serializer), in place of the generated protobuf ones.
        self.codecs = dict(codecs or {})
        self.limits = limits
        self.recorder = Recorder(metrics)
        self.inflight = 0
        # Read by the metrics at scrape time: calls in flight per client, calls refused per status code.
        self.per_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        # The wrapped handler of each method served so far (the registered services never change).
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    # -- admission and counting ----------------------------------------------------------------

    async def _begin(self, method: _Method, context: Context) -> Call:
        """Check the caller, count the call in and make it the current call (for limits and logs)."""
        metadata = context.invocation_metadata() or ()
        try:
            # The certificate is read only where certificates name callers (auth_context builds a dict).
            subject = _certificate_subject(context) if self.access.client_certificates else ""
            client = self.access.admit(context.peer() or "", bearer_token(tuple(metadata)), subject)
        except Unauthenticated as exc:
            self.refused[grpc.StatusCode.UNAUTHENTICATED.name] += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        if method.versioned:
            try:
                check_protocol_version(metadata)
            except ServiceError as exc:
                await self._refuse(context, exc)
        await self._count_in(context, client, method.shared)
        call = Call(method.name, client)
        _CALL.set(call)
        structlog.contextvars.bind_contextvars(client=client)
        return call

    async def _count_in(self, context: Context, identity: str, shared: bool) -> None:
        """Count the call against its client's cap and (unless it only waits) the shared one."""
        limits = self.limits
        per_client = min(limits.max_inflight_per_client, limits.max_inflight_requests)
        if self.per_client[identity] >= per_client:
            await self._refuse(
                context,
                ResourceExhausted(
                    f"this client has {self.per_client[identity]} calls in flight, the limit "
                    f"max_inflight_per_client={per_client}; finish or cancel some first"
                ),
            )
        if shared and self.inflight >= limits.max_inflight_requests:
            await self._refuse(
                context,
                ResourceExhausted(
                    f"the daemon is serving {self.inflight} calls, the limit max_inflight_requests="
                    f"{limits.max_inflight_requests}; retry shortly"
                ),
            )
        self.per_client[identity] += 1
        self.inflight += shared

    async def _refuse(self, context: Context, exc: ServiceError) -> None:
        self.refused[exc.code.name] += 1
        await context.abort(exc.code, str(exc), error_metadata(exc))

    def _count_out(self, identity: str, shared: bool) -> None:
        self.per_client[identity] -= 1
        if self.per_client[identity] <= 0:
            del self.per_client[identity]
        self.inflight -= shared

    def _requests(self, requests: AsyncIterator[T]) -> AsyncIterator[T]:
        timeout_s = self.limits.stream_idle_timeout_s
        return idle_limited(requests, timeout_s) if timeout_s > 0 else requests

    # -- the end of a call ---------------------------------------------------------------------

    async def _fail(self, call: Call, context: Context, exc: Exception, request_stream: bool) -> None:
        """End a failed call with its status (context.abort raises). Returns only when the client had
        cancelled the call: a request stream cut short inside a frame is what a cancellation looks
        like to the reader when it wins the race with the cancellation itself, so wait for that to
        land before blaming the client (a cancel is CANCELLED in the log, not INVALID_ARGUMENT). An
        unexpected error of a request stream may be the cancellation's doing too (CI logged a pipeline
        its client had cancelled as INTERNAL, not reproduced since): it gets the same grace, and if
        the cancellation lands it is logged as cancelled_call_error, not sent."""
        expected = expected_status(exc)
        if request_stream and (isinstance(exc, TruncatedFrame) or expected is None):
            deadline = time.monotonic() + CANCEL_GRACE_S
            while not context.cancelled() and time.monotonic() < deadline:
                await asyncio.sleep(CANCEL_POLL_S)
        if context.cancelled():
            if expected is None:  # what the cancellation broke: kept in the log, never sent
                log.info("cancelled_call_error", method=call.method, error=f"{type(exc).__name__}: {exc}")
            self.recorder.done(call, "CANCELLED")
            return
        code, message = expected or status_of(exc)
        self.recorder.done(call, code.name)
        await context.abort(code, message, error_metadata(exc))

    # -- the wrappers --------------------------------------------------------------------------

    def _unary_response(self, method: _Method, inner: Any, request_stream: bool) -> Callable[..., Any]:
        """Wrap a handler that answers once (its type in grpc's stubs is the sync one, hence Any)."""

        async def behavior(request: Any, context: Context) -> Any:
            call = await self._begin(method, context)
            async with _Ending(self, method, call, context, request_stream, streams=False):
                return await inner(self._requests(request) if request_stream else request, context)

        return behavior

    def _stream_response(self, method: _Method, inner: Any, request_stream: bool) -> Callable[..., Any]:
        """Wrap a handler that answers with a stream."""

        async def behavior(request: Any, context: Context) -> AsyncIterator[Any]:
            call = await self._begin(method, context)
            async with _Ending(self, method, call, context, request_stream, streams=True):
                # Closed here, whatever ends the call, so that what it counted is in its record.
                responses = inner(self._requests(request) if request_stream else request, context)
                async with aclosing(responses):
                    async for response in responses:
                        yield response

        return behavior

    def _wrap(self, path: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        method = _Method.of(path)
        deserializer, serializer = self.codecs.get(
            path, (handler.request_deserializer, handler.response_serializer)
        )
        codecs = {"request_deserializer": deserializer, "response_serializer": serializer}
        if handler.unary_unary is not None:
            behavior = self._unary_response(method, handler.unary_unary, False)
            return grpc.unary_unary_rpc_method_handler(behavior, **codecs)
        if handler.stream_unary is not None:
            behavior = self._unary_response(method, handler.stream_unary, True)
            return grpc.stream_unary_rpc_method_handler(behavior, **codecs)
        if handler.unary_stream is not None:
            behavior = self._stream_response(method, handler.unary_stream, False)
            return grpc.unary_stream_rpc_method_handler(behavior, **codecs)
        behavior = self._stream_response(method, handler.stream_stream, True)
        return grpc.stream_stream_rpc_method_handler(behavior, **codecs)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        path = handler_call_details.method
        wrapped = self._wrapped.get(path)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or path.startswith(_OPEN_PREFIXES):
            return handler
        wrapped = self._wrapped[path] = self._wrap(path, handler)
        return wrapped


@dataclass(slots=True)
class _Ending:
    """How a wrapped call ends, the same for every handler kind: its outcome in the record, a failure
    turned into its status, the call counted out. A failed unary call whose client had cancelled
    raises CancelledError (a return value would be sent); a stream then just ends."""

    guard: Guard
    method: _Method
    call: Call
    context: Context
    request_stream: bool
    streams: bool

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        guard, call = self.guard, self.call
        try:
            if exc is None:
                guard.recorder.done(call, "OK")
            elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the task or the stream ends
                guard.recorder.done(call, "CANCELLED")
            elif isinstance(exc, grpc.aio.AbortError):
                guard.recorder.done(call, _aborted_code(self.context))
            elif isinstance(exc, Exception):
                await guard._fail(call, self.context, exc, self.request_stream)
                if not self.streams:
                    raise asyncio.CancelledError from exc  # the client cancelled it
                return True
            return False
        finally:
            guard._count_out(call.client, self.method.shared)
