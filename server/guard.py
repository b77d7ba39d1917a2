"""The gate in front of every RknnServer RPC: authentication, the in-flight limit and the caller's identity.

It wraps each method's handler rather than filtering in the interceptor proper, because only the
servicer context knows the peer (loopback callers stay open unless --auth-loopback) and the TLS
certificate. Health and reflection stay open so that probes work without credentials.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
import structlog

from rknn_server.auth import TokenTable, bearer_token, is_local_peer, peer_host

_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_IDENTITY: ContextVar[str] = ContextVar("rknn_client_identity", default="")
Context = grpc.aio.ServicerContext


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


class Guard(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: TokenTable | None, auth_loopback: bool, max_inflight: int) -> None:
        self.tokens = tokens
        self.auth_loopback = auth_loopback
        self.max_inflight = max_inflight
        self.inflight = 0
        # Read by the metrics at scrape time: calls served per client, calls refused per status code.
        self.inflight_by_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    async def _admit(self, context: Context) -> str:
        """Check the caller, count the call in, and record who it is (for limits and logs)."""
        peer = context.peer() or ""
        token = bearer_token(tuple(context.invocation_metadata() or ()))
        name = self.tokens.identify(token) if self.tokens is not None and token is not None else None
        if self.tokens is not None and name is None and (self.auth_loopback or not is_local_peer(peer)):
            problem = "carries no token" if token is None else "carries a token this daemon does not accept"
            self.refused[grpc.StatusCode.UNAUTHENTICATED.name] += 1
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the call {problem}; send gRPC metadata 'authorization: Bearer <token>' "
                "(rknn_client: token= or RKNN_SERVER_TOKEN)",
            )
        if self.inflight >= self.max_inflight:
            self.refused[grpc.StatusCode.RESOURCE_EXHAUSTED.name] += 1
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the daemon is serving {self.inflight} calls, the limit max_inflight_requests="
                f"{self.max_inflight}; retry shortly",
            )
        identity = name or _certificate_subject(context) or peer_host(peer)
        _IDENTITY.set(identity)
        structlog.contextvars.bind_contextvars(client=identity)
        self.inflight += 1
        self.inflight_by_client[identity] += 1
        return identity

    def _leave(self, identity: str) -> None:
        self.inflight -= 1
        self.inflight_by_client[identity] -= 1
        if self.inflight_by_client[identity] <= 0:
            del self.inflight_by_client[identity]

    def _unary_response(self, inner: Any) -> Callable[..., Any]:
        """Wrap a handler that answers once (its type in grpc's stubs is the sync one, hence Any)."""

        async def behavior(request: Any, context: Context) -> Any:
            identity = await self._admit(context)
            try:
                return await inner(request, context)
            finally:
                self._leave(identity)

        return behavior

    def _stream_response(self, inner: Any) -> Callable[..., Any]:
        """Wrap a handler that answers with a stream."""

        async def behavior(request: Any, context: Context) -> AsyncIterator[Any]:
            identity = await self._admit(context)
            try:
                async for response in inner(request, context):
                    yield response
            finally:
                self._leave(identity)

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
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary_response(handler.unary_unary), **codecs)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._unary_response(handler.stream_unary), **codecs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(self._stream_response(handler.unary_stream), **codecs)
        return grpc.stream_stream_rpc_method_handler(self._stream_response(handler.stream_stream), **codecs)
