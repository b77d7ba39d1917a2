"""The client's exceptions, mapped from the daemon's error reason or gRPC status code in one place.

Each carries the daemon's own message (what was wrong and what was expected), never a bare code,
and the daemon's machine-readable reason (rknn_proto.reasons) when it sent one.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from rknn_proto.reasons import HINT_PREFIX, REASON_METADATA_KEY, Reason, parse_reason


class RknnError(Exception):
    """Base of everything the client raises. `hints` are facts the daemon sent with the error (e.g.
    `board_soc`), for each interface to word its own advice (see `advice`); `reason` is why, for a
    program to act on (None when the daemon sent none)."""

    def __init__(
        self, *args: object, hints: dict[str, str] | None = None, reason: Reason | None = None
    ) -> None:
        super().__init__(*args)
        self.hints = hints or {}
        self.reason = reason


class ErrorWithFix(Exception):
    """An error that says what is wrong (`problem`) and what to do about it (`fix`), for a person at
    a terminal (deploy, adb links)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n  fix: {fix}")
        self.problem = problem
        self.fix = fix


class InvalidInput(RknnError):
    """The request did not fit the model or the contract."""


class NotFound(RknnError):
    """An unknown session or model."""


class SessionLost(NotFound):
    """The session is gone: released, expired after its idle lease, or the daemon restarted."""


class FailedPrecondition(RknnError):
    """The request cannot be served in the daemon's current state (e.g. target mismatch)."""


class ResourceExhausted(RknnError):
    """A daemon limit was reached; the message names the limit and its value."""


class Unsupported(RknnError):
    """The daemon or its runtime cannot do this."""


class RuntimeFailure(RknnError):
    """The runtime failed while running a valid request."""


class ConnectionFailed(RknnError):
    """The daemon could not be reached."""


class VersionMismatch(RknnError):
    """Client and daemon speak protocol versions that cannot work together."""


class AuthenticationFailed(RknnError):
    """The daemon wants a token (or a client certificate) this client did not present or got wrong."""


_BY_CODE: dict[grpc.StatusCode, type[RknnError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.OUT_OF_RANGE: InvalidInput,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ALREADY_EXISTS: FailedPrecondition,
    grpc.StatusCode.ABORTED: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNIMPLEMENTED: Unsupported,
    grpc.StatusCode.INTERNAL: RuntimeFailure,
    grpc.StatusCode.DATA_LOSS: RuntimeFailure,
    grpc.StatusCode.UNKNOWN: RuntimeFailure,
    grpc.StatusCode.UNAVAILABLE: ConnectionFailed,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationFailed,
    grpc.StatusCode.PERMISSION_DENIED: AuthenticationFailed,
    grpc.StatusCode.DEADLINE_EXCEEDED: ConnectionFailed,
}


# Reasons that name a more precise exception than their status code does.
_BY_REASON: dict[Reason, type[RknnError]] = {
    Reason.SESSION_NOT_FOUND: SessionLost,
    Reason.PROTOCOL_TOO_OLD: VersionMismatch,
}


def from_rpc_error(exc: grpc.RpcError, where: str) -> RknnError:
    """The typed exception for a failed call, with the daemon's message and where it happened."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    trailing: Sequence[tuple[str, str | bytes]] = (
        exc.trailing_metadata() if isinstance(exc, grpc.Call) else None
    ) or ()
    hints = {
        str(key).removeprefix(HINT_PREFIX): str(value)
        for key, value in trailing
        if str(key).startswith(HINT_PREFIX)
    }
    reason = next((value for key, value in trailing if key == REASON_METADATA_KEY), None)
    return from_status(code, details, reason, hints, where)


def from_status(
    code: grpc.StatusCode, details: str, reason: str | bytes | None, hints: dict[str, str], where: str
) -> RknnError:
    """The typed exception for a status the daemon answered (a failed call's, or a doorbell reply's)."""
    parsed = parse_reason(reason)
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectionFailed(
            f"{where}: the daemon is not reachable ({details}). Check that rknn_server runs on the board "
            "(rknn-client doctor --device ID walks the whole chain)"
        )
    kind = _BY_REASON.get(parsed) if parsed is not None else None
    kind = kind or _BY_CODE.get(code, RknnError)
    return kind(f"{details} [{code.name} from {where}]", hints=hints, reason=parsed)


def advice(error: BaseException, interface: str) -> str:
    """What to do about `error`, in the terms of `interface`: "cli" (rknn-client's flags) or "toolkit"
    (the RKNN-Toolkit2 API); '' when the error carries no hint."""
    hints = error.hints if isinstance(error, RknnError) else {}
    soc = hints.get("board_soc")
    if soc:
        fix = f"--target {soc}" if interface == "cli" else f"init_runtime(target='{soc}')"
        wanted = hints.get("target")
        other = f", or connect to a {wanted} board" if wanted else ""
        return f"use {fix}{other}"
    return ""
