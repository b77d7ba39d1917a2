"""A failed call carries a machine-readable reason (rknn_proto.reasons) beside its message, and the
client picks its exception from it, not from the message's words."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from rknn_client.errors import NotFound, SessionLost, VersionMismatch, from_rpc_error
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.reasons import REASON_METADATA_KEY, Reason
from rknn_proto.version import PROTOCOL_VERSION_METADATA_KEY
from rknn_server.testing import DaemonProcess


@pytest.fixture
def stub(host_daemon: DaemonProcess) -> Iterator[rknn_pb2_grpc.RknnServerStub]:
    with grpc.insecure_channel(host_daemon.address) as channel:
        yield rknn_pb2_grpc.RknnServerStub(channel)


def failure(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def reason_sent(exc: grpc.RpcError) -> str | None:
    assert isinstance(exc, grpc.Call)
    return next((v for k, v in exc.trailing_metadata() or () if k == REASON_METADATA_KEY), None)


def test_an_unknown_session_is_session_not_found_and_the_client_says_session_lost(stub) -> None:
    exc = failure(lambda: stub.KeepAlive(rknn_pb2.KeepAliveRequest(session_id="f" * 32)))
    assert reason_sent(exc) == "SESSION_NOT_FOUND"
    error = from_rpc_error(exc, "keep_alive")
    assert isinstance(error, SessionLost)
    assert error.reason is Reason.SESSION_NOT_FOUND


def test_an_unknown_model_is_model_not_cached_not_a_lost_session(stub) -> None:
    exc = failure(lambda: stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest="0" * 64)))
    assert reason_sent(exc) == "MODEL_NOT_CACHED"
    error = from_rpc_error(exc, "init_runtime")
    assert type(error) is NotFound and error.reason is Reason.MODEL_NOT_CACHED


def test_a_too_old_client_gets_protocol_too_old_and_a_version_mismatch(stub) -> None:
    exc = failure(
        lambda: stub.GetInfo(rknn_pb2.GetInfoRequest(), metadata=((PROTOCOL_VERSION_METADATA_KEY, "0"),))
    )
    assert reason_sent(exc) == "PROTOCOL_TOO_OLD"
    assert isinstance(from_rpc_error(exc, "get_info"), VersionMismatch)


def test_a_limit_is_limit_exceeded(stub) -> None:
    man = rknn_pb2.ModelManifest(
        digest="1" * 64, files=[rknn_pb2.ModelFile(name="m.onnx", size=1 << 50, sha256="2" * 64)]
    )
    exc = failure(lambda: stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=man)))
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason_sent(exc) == "LIMIT_EXCEEDED"
