"""The one interceptor (guard.py) in front of fake handlers: what a failed or finished call becomes
(status, reason metadata, reference id, metrics, one log event), the rknn-only version check, and
the same treatment for a service of another protocol."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from rknn_proto.framing import TruncatedFrame
from rknn_proto.reasons import HINT_PREFIX, REASON_METADATA_KEY, Reason
from rknn_proto.version import PROTOCOL_VERSION_METADATA_KEY
from rknn_server.config.limits import Limits
from rknn_server.errors import FailedPrecondition
from rknn_server.kit import guard
from rknn_server.kit.auth import AccessPolicy
from rknn_server.kit.guard import Guard, client_identity, current_call
from rknn_server.observe.metrics import DaemonMetrics

RKNN_METHOD = "/rknn.v1.RknnServer/Fake"
OTHER_METHOD = "/inference.GRPCInferenceService/ModelInfer"  # KServe v2: no rknn protocol version


def recorded_name(path: str) -> str:
    """The method label a call is recorded under: rknn.v1's short names, KServe v2's as `v2.<RPC>`."""
    short = path.rsplit("/", 1)[-1]
    return f"v2.{short}" if path.startswith("/inference.") else short


Trailing = tuple[tuple[str, str], ...]


class FakeContext:
    """The parts of grpc.aio.ServicerContext the interceptor uses; abort raises as grpc's does."""

    def __init__(self, metadata: Trailing = (), cancelled: bool = False) -> None:
        self.metadata = metadata
        self.is_cancelled = cancelled
        self.aborted: tuple[grpc.StatusCode, str, Trailing] | None = None

    def invocation_metadata(self) -> Trailing:
        return self.metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def cancelled(self) -> bool:
        return self.is_cancelled

    def code(self) -> grpc.StatusCode | None:
        return self.aborted[0] if self.aborted else None

    async def abort(self, code: grpc.StatusCode, details: str, trailing: Trailing = ()) -> None:
        self.aborted = (code, details, tuple(trailing))
        raise grpc.aio.AbortError()


@dataclass
class Details:
    method: str


class Served:
    """A guard in front of one fake handler of `method`; counts how often grpc's lookup ran."""

    def __init__(self, handler: grpc.RpcMethodHandler, method: str = RKNN_METHOD) -> None:
        self.metrics = DaemonMetrics()
        self.guard = Guard(AccessPolicy(None, False, False), Limits(), self.metrics)
        self.handler, self.method, self.lookups = handler, method, 0

    async def _continuation(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        self.lookups += 1
        return self.handler

    async def wrapped(self) -> grpc.RpcMethodHandler:
        return await self.guard.intercept_service(self._continuation, Details(self.method))  # type: ignore[arg-type]

    def count(self, outcome: str) -> float:
        name = recorded_name(self.method)
        return (
            self.metrics.registry.get_sample_value("rknn_rpc_total", {"method": name, "outcome": outcome})
            or 0
        )

    def sent(self) -> float:
        name = recorded_name(self.method)
        return self.metrics.registry.get_sample_value("rknn_rpc_sent_bytes_total", {"method": name}) or 0


def unary(body: Callable[[Any], Awaitable[Any]]) -> grpc.RpcMethodHandler:
    async def behavior(request: Any, context: Any) -> Any:
        return await body(request)

    return grpc.unary_unary_rpc_method_handler(behavior)


async def call_unary(served: Served, context: FakeContext, request: Any = "request") -> Any:
    handler = await served.wrapped()
    return await handler.unary_unary(request, context)  # type: ignore[misc]


def rpc_events(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "rpc"]


def test_a_service_error_becomes_its_status_with_reason_and_hints_in_one_record() -> None:
    async def refuse(request: Any) -> Any:
        current_call().session = "0123456789abcdef"
        raise FailedPrecondition(
            "the model is for rk3566", hints={"board_soc": "rk3588"}, reason=Reason.TARGET_MISMATCH
        )

    served, context = Served(unary(refuse)), FakeContext()
    with capture_logs() as logs, pytest.raises(grpc.aio.AbortError):
        asyncio.run(call_unary(served, context))
    assert context.aborted == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "the model is for rk3566",
        ((REASON_METADATA_KEY, "TARGET_MISMATCH"), (f"{HINT_PREFIX}board_soc", "rk3588")),
    )
    assert served.count("FAILED_PRECONDITION") == 1 and served.count("OK") == 0
    [event] = rpc_events(logs)
    assert event["method"] == "Fake" and event["outcome"] == "FAILED_PRECONDITION"
    assert event["session"] == "0123456789ab"
    assert served.guard.per_client == {} and served.guard.inflight == 0


def test_an_unexpected_error_is_internal_with_a_reference_and_its_detail_only_in_the_log() -> None:
    async def crash(request: Any) -> Any:
        raise KeyError("/home/board/secret/path")

    served, context = Served(unary(crash)), FakeContext()
    with capture_logs() as logs, pytest.raises(grpc.aio.AbortError):
        asyncio.run(call_unary(served, context))
    assert context.aborted is not None
    code, message, trailing = context.aborted
    assert code == grpc.StatusCode.INTERNAL and "/home" not in message and trailing == ()
    reference = re.search(r"reference ([0-9a-f]{12})", message)
    assert reference is not None
    [internal] = [e for e in logs if e["event"] == "internal_error"]
    assert internal["reference"] == reference.group(1) and isinstance(internal["exc_info"], KeyError)
    [event] = rpc_events(logs)
    assert event["outcome"] == "INTERNAL" and served.count("INTERNAL") == 1


def test_a_finished_call_is_counted_once_and_the_handler_sees_its_caller() -> None:
    seen = []

    async def answer(request: Any) -> Any:
        seen.append(client_identity())
        current_call().bytes_in = 10
        return "response"

    served = Served(unary(answer))

    async def twice() -> list[Any]:
        return [await call_unary(served, FakeContext()) for _ in range(2)]

    with capture_logs() as logs:
        assert asyncio.run(twice()) == ["response", "response"]
    assert seen == ["127.0.0.1:40000"] * 2
    assert served.count("OK") == 2 and len(rpc_events(logs)) == 2
    assert served.lookups == 1  # the wrapped handler is made once per method, not per call


def test_the_protocol_version_is_checked_for_rknn_methods_only() -> None:
    ran: list[str] = []

    async def answer(request: Any) -> Any:
        ran.append(request)
        return "response"

    old = ((PROTOCOL_VERSION_METADATA_KEY, "0"),)
    rknn, other = Served(unary(answer)), Served(unary(answer), OTHER_METHOD)
    context = FakeContext(old)
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(call_unary(rknn, context))
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert (REASON_METADATA_KEY, Reason.PROTOCOL_TOO_OLD.value) in context.aborted[2]
    assert ran == [] and rknn.guard.refused == {"FAILED_PRECONDITION": 1}
    assert asyncio.run(call_unary(other, FakeContext(old), "kserve")) == "response"
    assert ran == ["kserve"] and other.count("OK") == 1


def streaming(fail: BaseException) -> grpc.RpcMethodHandler:
    """A response stream that counts what it sends, sends one message, then fails."""

    async def behavior(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            current_call().bytes_out += len(request)
            yield request
            raise fail

    return grpc.stream_stream_rpc_method_handler(behavior)


async def drain(served: Served, context: FakeContext) -> list[Any]:
    async def requests() -> AsyncIterator[str]:
        yield "abcd"

    handler = await served.wrapped()
    return [r async for r in handler.stream_stream(requests(), context)]  # type: ignore[misc]


def test_a_failing_stream_sends_what_it_had_then_its_status_with_its_bytes_counted() -> None:
    served, context = (
        Served(streaming(FailedPrecondition("gone", reason=Reason.SESSION_BROKEN))),
        FakeContext(),
    )
    got: list[Any] = []

    async def main() -> None:
        async def requests() -> AsyncIterator[str]:
            yield "abcd"

        handler = await served.wrapped()
        async for response in handler.stream_stream(requests(), context):  # type: ignore[misc]
            got.append(response)

    with capture_logs() as logs, pytest.raises(grpc.aio.AbortError):
        asyncio.run(main())
    assert got == ["abcd"]
    assert context.aborted is not None and (REASON_METADATA_KEY, "SESSION_BROKEN") in context.aborted[2]
    [event] = rpc_events(logs)
    assert (event["outcome"], event["bytes_out"]) == ("FAILED_PRECONDITION", 4) and served.sent() == 4


def test_a_stream_cut_short_by_a_cancelled_client_is_cancelled_not_the_clients_error() -> None:
    served, context = (
        Served(streaming(TruncatedFrame("the stream ended inside a frame"))),
        FakeContext(cancelled=True),
    )
    with capture_logs() as logs:
        assert asyncio.run(drain(served, context)) == ["abcd"]
    assert context.aborted is None
    [event] = rpc_events(logs)
    assert event["outcome"] == "CANCELLED" and served.count("CANCELLED") == 1
    assert served.guard.per_client == {} and served.guard.inflight == 0


def test_a_handlers_own_abort_is_recorded_with_its_code() -> None:
    async def behavior(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such model")

    served, context = Served(grpc.unary_unary_rpc_method_handler(behavior), OTHER_METHOD), FakeContext()
    with capture_logs() as logs, pytest.raises(grpc.aio.AbortError):
        asyncio.run(call_unary(served, context))
    assert context.aborted == (grpc.StatusCode.NOT_FOUND, "no such model", ())
    [event] = rpc_events(logs)
    assert event["outcome"] == "NOT_FOUND" and served.count("NOT_FOUND") == 1


class CancelledLater(FakeContext):
    """A call whose cancellation lands a few looks after its handler failed (the handler's read won
    the race with it)."""

    def __init__(self, looks: int) -> None:
        super().__init__()
        self.looks = looks

    def cancelled(self) -> bool:
        self.looks -= 1
        return self.looks < 0


def test_an_unexpected_error_of_a_stream_the_client_cancels_is_cancelled_and_logged() -> None:
    """CI logged a pipeline the client had cancelled as INTERNAL: the request stream failed in a way
    the daemon does not expect as the cancellation landed, and only a cut frame waited for it."""
    served, context = Served(streaming(RuntimeError("the request iterator broke"))), CancelledLater(looks=5)
    with capture_logs() as logs:
        assert asyncio.run(drain(served, context)) == ["abcd"]
    assert context.aborted is None
    [event] = rpc_events(logs)
    assert event["outcome"] == "CANCELLED" and served.count("CANCELLED") == 1
    [broken] = [e for e in logs if e["event"] == "cancelled_call_error"]
    assert broken["error"] == "RuntimeError: the request iterator broke"


def test_an_unexpected_error_of_a_stream_nobody_cancels_is_internal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "CANCEL_GRACE_S", 0.05)
    served, context = Served(streaming(RuntimeError("a bug"))), FakeContext()
    with capture_logs() as logs, pytest.raises(grpc.aio.AbortError):
        asyncio.run(drain(served, context))
    assert context.aborted is not None and context.aborted[0] is grpc.StatusCode.INTERNAL
    assert "a bug" not in context.aborted[1]  # the detail stays in the log, under its reference
    [event] = rpc_events(logs)
    assert event["outcome"] == "INTERNAL" and served.count("INTERNAL") == 1
