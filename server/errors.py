"""The daemon's error vocabulary, typed once and mapped to gRPC status codes in one place."""

from __future__ import annotations

import errno
import secrets

import grpc
import structlog

from rknn_proto.codec import CodecError, LimitExceeded
from rknn_proto.reasons import HINT_PREFIX, REASON_METADATA_KEY, Reason
from rknn_server.runtime.base import (
    BackendError,
    ExecutionError,
    InputError,
    ModelFormatError,
    OverBudget,
    UnsupportedError,
    WorkerLost,
)
from rknn_server.runtime.redact import without_paths

log = structlog.get_logger("rknn_server.errors")


class ServiceError(Exception):
    """An error with the gRPC status it travels as. The message is what the user reads; `hints` are
    facts (e.g. the board's SoC) each client turns into advice in its own terms (a CLI flag, an API
    argument). `reason` (rknn_proto.reasons) lets a program act on the error without reading it."""

    code = grpc.StatusCode.INTERNAL
    reason: Reason | None = None

    def __init__(
        self, *args: object, hints: dict[str, str] | None = None, reason: Reason | None = None
    ) -> None:
        super().__init__(*args)
        self.hints = hints or {}
        if reason is not None:
            self.reason = reason


class InvalidInput(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(ServiceError):
    """The caller may not do this (e.g. name another user's file as a shared-memory region)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Aborted(ServiceError):
    """A conflict with a concurrent call (two uploads of one model): the client retries from the start."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = Reason.LIMIT_EXCEEDED


class StreamIdle(ServiceError):
    """A request stream that sent nothing for --stream-idle-timeout (server/kit/guard.py)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = Reason.STREAM_IDLE


class DataLoss(ServiceError):
    code = grpc.StatusCode.DATA_LOSS


_BACKEND_CODES: dict[type[BackendError], grpc.StatusCode] = {
    InputError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelFormatError: grpc.StatusCode.FAILED_PRECONDITION,
    UnsupportedError: grpc.StatusCode.UNIMPLEMENTED,
    ExecutionError: grpc.StatusCode.INTERNAL,
    OverBudget: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
log = structlog.get_logger("rknn_server.errors")


def reason_of(exc: BaseException) -> Reason | None:
    if isinstance(exc, ServiceError):
        return exc.reason
    if isinstance(exc, (LimitExceeded, OverBudget)):
        return Reason.LIMIT_EXCEEDED
    if isinstance(exc, WorkerLost):
        return Reason.SESSION_BROKEN
    return None


def error_metadata(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The error's reason and hints as trailing metadata (rknn_proto.reasons), empty when it has none."""
    hints = exc.hints if isinstance(exc, ServiceError) else {}
    reason = reason_of(exc)
    found = ((REASON_METADATA_KEY, reason.value),) if reason is not None else ()
    return found + tuple((f"{HINT_PREFIX}{key}", value) for key, value in hints.items())


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message an exception travels as; unknown exceptions are INTERNAL with a reference
    id only (logged with the detail)."""
    return expected_status(exc) or (grpc.StatusCode.INTERNAL, _internal(exc))


def expected_status(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status of an error the daemon means (a refusal, bad input, a runtime's failure); None for
    an unexpected one (status_of logs it and sends INTERNAL)."""
    if isinstance(exc, ServiceError):
        return exc.code, str(exc)
    if isinstance(exc, LimitExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, CodecError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, (
            f"the board's disk is full ({exc.strerror}); free space or lower the model cache quota"
        )
    if isinstance(exc, BackendError):
        code = next(
            (c for kind, c in _BACKEND_CODES.items() if isinstance(exc, kind)), grpc.StatusCode.INTERNAL
        )
        # A runtime's failure can quote a library's own text with server paths in it; the messages of
        # the other kinds are composed by the runtimes about the client's input, and may quote it.
        return code, without_paths(str(exc)) if code == grpc.StatusCode.INTERNAL else str(exc)
    return None


def _internal(exc: BaseException) -> str:
    """An unexpected error: its text (paths, internals) stays in the daemon's log under a reference
    id; the client gets only the id, to quote when reporting it."""
    reference = secrets.token_hex(6)
    log.error("internal_error", reference=reference, error=type(exc).__name__, exc_info=exc)
    return (
        f"internal error in the daemon (reference {reference}); the details are in the daemon's log "
        "under that reference"
    )
