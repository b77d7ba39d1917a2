"""The daemon's error vocabulary, typed once and mapped to gRPC status codes in one place."""

from __future__ import annotations

import errno

import grpc

from rknn_proto.codec import CodecError, LimitExceeded
from rknn_server.runtime.base import (
    BackendError,
    ExecutionError,
    InputError,
    ModelFormatError,
    OverBudget,
    UnsupportedError,
)


class ServiceError(Exception):
    """An error with the gRPC status it travels as. The message is what the user reads."""

    code = grpc.StatusCode.INTERNAL


class InvalidInput(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ServiceError):
    """A conflict with a concurrent call (two uploads of one model): the client retries from the start."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class StreamIdle(ServiceError):
    """A request stream that sent nothing for --stream-idle-timeout (server/guard.py)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(ServiceError):
    code = grpc.StatusCode.DATA_LOSS


_BACKEND_CODES: dict[type[BackendError], grpc.StatusCode] = {
    InputError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelFormatError: grpc.StatusCode.FAILED_PRECONDITION,
    UnsupportedError: grpc.StatusCode.UNIMPLEMENTED,
    ExecutionError: grpc.StatusCode.INTERNAL,
    OverBudget: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message an exception travels as; unknown exceptions are INTERNAL with their text."""
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
        for kind, code in _BACKEND_CODES.items():
            if isinstance(exc, kind):
                return code, str(exc)
        return grpc.StatusCode.INTERNAL, str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error in the daemon: {type(exc).__name__}: {exc}"
