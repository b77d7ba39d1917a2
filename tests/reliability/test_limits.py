"""Configured limits: each is reported by GetInfo, and a request beyond one gets RESOURCE_EXHAUSTED naming it
while the daemon and other clients' sessions carry on. (The model cache's limits: test_cache_attacks.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import rknn_client.device
from rknn_client.errors import ResourceExhausted
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from tests.reliability.conftest import OTHER_TOKEN, TOKEN, StartDaemon, cnn_input, device, info, weighty_model


def test_limits_are_reported_and_enforced_per_client(
    daemons: StartDaemon, token_file: Path, cnn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = daemons(
        "--auth-token-file", str(token_file), "--max-sessions", "3",
        "--max-sessions-per-client", "2", "--max-tensor-rank", "5", "--max-tensor-elements", "100000",
        "--max-chunk-bytes", "65536", "--max-inflight-requests", "8", "--max-model-bytes", "4000000",
    )  # fmt: skip
    limits = info(daemon, TOKEN).limits
    assert (limits.max_sessions, limits.max_sessions_per_client, limits.max_tensor_rank) == (3, 2, 5)
    assert (limits.max_tensor_elements, limits.max_chunk_bytes, limits.max_inflight_requests) == (
        100000,
        65536,
        8,
    )
    assert limits.max_model_bytes == 4000000
    with device(daemon, token=TOKEN) as alice, device(daemon, token=OTHER_TOKEN) as bob:
        kept = [alice.load(cnn), alice.load(cnn)]
        with pytest.raises(ResourceExhausted, match="max_sessions_per_client=2"):
            alice.load(cnn)
        third = bob.load(cnn)
        with pytest.raises(ResourceExhausted, match="max_sessions=3"):
            bob.load(cnn)
        weighty = weighty_model(tmp_path / "weighty.onnx", 1)
        with monkeypatch.context() as older:  # a client that sends 1 MiB chunks whatever the limit
            older.setattr(rknn_client.device, "upload_chunk_bytes", lambda limits: 1 << 20)
            with pytest.raises(ResourceExhausted, match="max_chunk_bytes=65536"):
                bob.upload(weighty)
        assert not bob.upload(weighty).cached  # this client follows the daemon's limit
        assert third.run([cnn_input()])[0].shape == (1, 10)
        for session in kept:
            assert session.run([cnn_input()])[0].shape == (1, 10)
    assert info(daemon, TOKEN).open_sessions == 3


def _raw_inference(address: str, session_id: str, meta: rknn_pb2.TensorMeta) -> grpc.StatusCode:
    def requests() -> Iterator[rknn_pb2.InferenceRequest]:
        yield rknn_pb2.InferenceRequest(header=rknn_pb2.InferenceHeader(session_id=session_id, inputs=[meta]))

    with grpc.insecure_channel(address) as channel:
        try:
            list(rknn_pb2_grpc.RknnServerStub(channel).Inference(requests(), timeout=30))
        except grpc.RpcError as exc:
            assert exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or "max_" in (exc.details() or "")
            return exc.code()
    return grpc.StatusCode.OK


def test_declared_tensors_over_the_limits_are_refused_before_allocation(
    daemons: StartDaemon, cnn: Path
) -> None:
    daemon = daemons("--max-tensor-rank", "5", "--max-tensor-elements", "100000")
    with device(daemon) as dev, dev.load(cnn) as session:
        f32 = rknn_pb2.DATA_TYPE_FLOAT32
        huge = rknn_pb2.TensorMeta(dtype=f32, shape=[1 << 20, 1 << 20], byte_length=4 << 40)
        deep = rknn_pb2.TensorMeta(dtype=f32, shape=[1] * 6, byte_length=4)
        for meta in (huge, deep):
            assert _raw_inference(daemon.address, session.id, meta) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert session.run([cnn_input()])[0].shape == (1, 10)


def test_model_over_max_model_bytes_is_refused(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons("--max-model-bytes", "100")
    with device(daemon) as dev, pytest.raises(ResourceExhausted, match="max_model_bytes=100"):
        dev.upload(cnn)
