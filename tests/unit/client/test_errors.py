"""The client's exception comes from the daemon's reason and status code, never from the message text."""

from __future__ import annotations

import grpc
import pytest

from rknn_client.errors import NotFound, ResourceExhausted, SessionLost, from_rpc_error
from rknn_proto.reasons import HINT_PREFIX, REASON_METADATA_KEY, Reason, parse_reason


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What a failed call raises, as far as from_rpc_error reads it."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...]) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing

    def initial_metadata(self):  # type: ignore[no-untyped-def]
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:  # type: ignore[no-untyped-def]
        return False


def test_the_reason_picks_session_lost_whatever_the_message_says() -> None:
    exc = FakeRpcError(grpc.StatusCode.NOT_FOUND, "gone", ((REASON_METADATA_KEY, "SESSION_NOT_FOUND"),))
    error = from_rpc_error(exc, "run")
    assert type(error) is SessionLost and error.reason is Reason.SESSION_NOT_FOUND


def test_a_message_that_mentions_a_session_is_not_a_lost_session_without_the_reason() -> None:
    error = from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "session model gone", ()), "run")
    assert type(error) is NotFound and error.reason is None


def test_an_unknown_reason_falls_back_to_the_code_and_hints_still_arrive() -> None:
    trailing = ((REASON_METADATA_KEY, "SOMETHING_NEW"), (f"{HINT_PREFIX}board_soc", "rk3588"))
    error = from_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", trailing), "upload")
    assert type(error) is ResourceExhausted
    assert error.reason is None and error.hints == {"board_soc": "rk3588"}


@pytest.mark.parametrize(
    ("value", "expected"), [(b"LIMIT_EXCEEDED", Reason.LIMIT_EXCEEDED), ("", None), (None, None)]
)
def test_parse_reason(value: str | bytes | None, expected: Reason | None) -> None:
    assert parse_reason(value) is expected
