"""The gate in front of every RknnServer RPC: authentication, the in-flight limits and the caller's identity.

It wraps each method's handler rather than filtering in the interceptor proper, because only the
servicer context knows the peer and the TLS certificate; who is let in is auth.AccessPolicy's call.
Health and reflection stay open so that probes work without credentials.

In-flight calls are capped in total (--max-inflight-requests) and per client identity
(--max-inflight-per-client), so that one client's idle streams cannot lock others out. A Reserve
that waits for the board holds nothing but a timer, so it counts against its client's own cap only,
never the shared one. Every request stream must deliver its next message within
--stream-idle-timeout, else the call ends with DEADLINE_EXCEEDED and drops what it had buffered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog

from rknn_server.auth import AccessPolicy, Unauthenticated, bearer_token
from rknn_server.errors import ResourceExhausted, ServiceError, StreamIdle, error_metadata

_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# Calls that may wait long for a shared resource without holding any: outside the shared cap.
_WAITING_SUFFIXES = ("/Reserve",)
_IDENTITY: ContextVar[str] = ContextVar("rknn_client_identity", default="")
Context = grpc.aio.ServicerContext
T = TypeVar("T")


@dataclass(frozen=True)
class CallLimits:
    """How many calls may be in flight, in total and per client identity, and how long a request
    stream may stay silent (0: no limit)."""

    max_inflight: int = 64
    max_inflight_per_client: int = 16
    stream_idle_timeout_s: float = 30.0


def client_identity() -> str:
    """The identity of the caller whose RPC is being served (empty outside an RPC)."""
    return _IDENTITY.get()


def _certificate_subject(context: Context) -> str:
    auth = context.auth_context() or {}
    for key in ("x509_subject", "x509_common_name"):
        values = list(auth.get(key) or ())
        if values:
            value = values[0]
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return ""


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


class Guard(grpc.aio.ServerInterceptor):
    def __init__(self, access: AccessPolicy, limits: CallLimits) -> None:
        self.access = access
        self.limits = limits
        self.inflight = 0
        # Read by the metrics at scrape time: calls in flight per client, calls refused per status code.
        self.per_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    async def _count_in(self, context: Context, identity: str, shared: bool) -> None:
        """Count the call against its client's cap and (unless it only waits) the shared one."""
        limits = self.limits
        per_client = min(limits.max_inflight_per_client, limits.max_inflight)
        if self.per_client[identity] >= per_client:
            await self._refuse(
                context,
                ResourceExhausted(
                    f"this client has {self.per_client[identity]} calls in flight, the limit "
                    f"max_inflight_per_client={per_client}; finish or cancel some first"
                ),
            )
        if shared and self.inflight >= limits.max_inflight:
            await self._refuse(
                context,
                ResourceExhausted(
                    f"the daemon is serving {self.inflight} calls, the limit max_inflight_requests="
                    f"{limits.max_inflight}; retry shortly"
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

    async def _admit(self, context: Context, shared: bool = True) -> str:
        """Check the caller, count the call in, and record who it is (for limits and logs)."""
        token = bearer_token(tuple(context.invocation_metadata() or ()))
        try:
            identity = self.access.admit(context.peer() or "", token, _certificate_subject(context))
        except Unauthenticated as exc:
            self.refused[grpc.StatusCode.UNAUTHENTICATED.name] += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        _IDENTITY.set(identity)
        structlog.contextvars.bind_contextvars(client=identity)
        await self._count_in(context, identity, shared)
        return identity

    def _unary_response(self, inner: Any, streaming: bool, shared: bool) -> Callable[..., Any]:
        """Wrap a handler that answers once (its type in grpc's stubs is the sync one, hence Any)."""

        async def behavior(request: Any, context: Context) -> Any:
            identity = await self._admit(context, shared)
            try:
                return await inner(self._requests(request) if streaming else request, context)
            finally:
                self._count_out(identity, shared)

        return behavior

    def _stream_response(self, inner: Any, streaming: bool) -> Callable[..., Any]:
        """Wrap a handler that answers with a stream."""

        async def behavior(request: Any, context: Context) -> AsyncIterator[Any]:
            identity = await self._admit(context)
            try:
                async for response in inner(self._requests(request) if streaming else request, context):
                    yield response
            finally:
                self._count_out(identity, True)

        return behavior

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_OPEN_PREFIXES):
            return handler
        codecs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        shared = not handler_call_details.method.endswith(_WAITING_SUFFIXES)
        if handler.unary_unary is not None:
            behavior = self._unary_response(handler.unary_unary, False, shared)
            return grpc.unary_unary_rpc_method_handler(behavior, **codecs)
        if handler.stream_unary is not None:
            behavior = self._unary_response(handler.stream_unary, True, shared)
            return grpc.stream_unary_rpc_method_handler(behavior, **codecs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream_response(handler.unary_stream, False), **codecs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._stream_response(handler.stream_stream, True), **codecs
        )
