"""Bad input gets a clear status and loses nothing: each case against a real daemon over raw gRPC,
then a check that the daemon still serves and holds no leaked session."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from demo.daemon_process import DaemonProcess
from rknn_client import connect
from rknn_proto import codec, manifest, rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import PROTOCOL_VERSION_METADATA_KEY
from tests import models

META = ((PROTOCOL_VERSION_METADATA_KEY, "1"),)


@pytest.fixture
def stub(host_daemon: DaemonProcess) -> Iterator[rknn_pb2_grpc.RknnServerStub]:
    with grpc.insecure_channel(host_daemon.address) as channel:
        yield rknn_pb2_grpc.RknnServerStub(channel)


@pytest.fixture
def session_id(stub, host_daemon: DaemonProcess, cnn_model: Path) -> Iterator[str]:
    with connect(host_daemon.url) as device:
        digest = device.upload(cnn_model).digest
    reply = stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest=digest), metadata=META)
    yield reply.session_id
    try:
        stub.Release(rknn_pb2.ReleaseRequest(session_id=reply.session_id), metadata=META)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND


@pytest.fixture(autouse=True)
def daemon_still_serves(host_daemon: DaemonProcess, stub) -> Iterator[None]:
    before = stub.GetInfo(rknn_pb2.GetInfoRequest()).open_sessions
    yield
    assert host_daemon.process.poll() is None, "the daemon died"
    assert stub.GetInfo(rknn_pb2.GetInfoRequest()).open_sessions <= before


def inference(stub, messages: list[rknn_pb2.InferenceRequest]) -> list[rknn_pb2.InferenceResponse]:
    return list(stub.Inference(iter(messages), metadata=META))


def header(session_id: str, *metas: rknn_pb2.TensorMeta) -> rknn_pb2.InferenceRequest:
    return rknn_pb2.InferenceRequest(
        header=rknn_pb2.InferenceHeader(session_id=session_id, inputs=list(metas))
    )


def good_input() -> np.ndarray:
    return np.zeros((1, 3, 16, 16), dtype=np.float32)


def expect(code: grpc.StatusCode, *fragments: str):
    class _Expect:
        def __enter__(self) -> None:
            return None

        def __exit__(self, kind, exc, tb) -> bool:
            assert isinstance(exc, grpc.RpcError), f"expected {code.name}, the call succeeded"
            assert exc.code() == code, f"{exc.code()}: {exc.details()}"
            for fragment in fragments:
                assert fragment in exc.details(), exc.details()
            return True

    return _Expect()


def test_wrong_input_count(stub, session_id: str) -> None:
    a = good_input()
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "1 input(s)", "2 were sent"):
        inference(stub, [header(session_id, codec.meta_of(a), codec.meta_of(a))])


def test_wrong_shape(stub, session_id: str) -> None:
    a = np.zeros((1, 3, 8, 8), dtype=np.float32)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "[1, 3, 8, 8]", "[1, 3, 16, 16]"):
        inference(stub, [header(session_id, codec.meta_of(a))])


def test_wrong_dtype(stub, session_id: str) -> None:
    a = np.zeros((1, 3, 16, 16), dtype=np.int32)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "int32", "float32"):
        inference(stub, [header(session_id, codec.meta_of(a))])


def test_byte_length_that_does_not_match_the_shape(stub, session_id: str) -> None:
    meta = codec.meta_of(good_input())
    meta.byte_length -= 4
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "byte_length", "expected 3072 bytes"):
        inference(stub, [header(session_id, meta)])


def test_more_bytes_than_declared(stub, session_id: str) -> None:
    a = good_input()
    chunk = rknn_pb2.TensorChunk(tensor_index=0, offset=0, data=a.tobytes() + b"\0" * 8)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "declared 3072"):
        inference(stub, [header(session_id, codec.meta_of(a)), rknn_pb2.InferenceRequest(chunk=chunk)])


def test_truncated_inference_stream(stub, session_id: str) -> None:
    a = good_input()
    chunk = rknn_pb2.TensorChunk(tensor_index=0, offset=0, data=a.tobytes()[:100])
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "stream ended", "100 of 3072"):
        inference(stub, [header(session_id, codec.meta_of(a)), rknn_pb2.InferenceRequest(chunk=chunk)])


def test_chunk_at_the_wrong_offset(stub, session_id: str) -> None:
    a = good_input()
    chunk = rknn_pb2.TensorChunk(tensor_index=0, offset=8, data=a.tobytes())
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "offset 8", "expected offset 0"):
        inference(stub, [header(session_id, codec.meta_of(a)), rknn_pb2.InferenceRequest(chunk=chunk)])


def test_absurd_declared_size_is_refused_before_allocating(stub, session_id: str) -> None:
    meta = rknn_pb2.TensorMeta(
        dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, 3, 1 << 30, 1 << 30], byte_length=12 << 60
    )
    with expect(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_tensor_bytes"):
        inference(stub, [header(session_id, meta)])


def test_negative_dimension_and_unknown_dtype(stub, session_id: str) -> None:
    negative = rknn_pb2.TensorMeta(dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, -3, 16, 16], byte_length=0)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "[1, -3, 16, 16]"):
        inference(stub, [header(session_id, negative)])
    unknown = rknn_pb2.TensorMeta(dtype=99, shape=[1], byte_length=4)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "unknown data type code 99"):
        inference(stub, [header(session_id, unknown)])


def test_empty_stream_and_chunk_before_header(stub, session_id: str) -> None:
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "empty", "InferenceHeader"):
        inference(stub, [])
    chunk = rknn_pb2.TensorChunk(tensor_index=0, offset=0, data=b"x")
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "must be an InferenceHeader"):
        inference(stub, [rknn_pb2.InferenceRequest(chunk=chunk)])


def test_unknown_and_released_sessions(stub, session_id: str) -> None:
    a = good_input()
    with expect(grpc.StatusCode.NOT_FOUND, "does not exist", "init_runtime again"):
        inference(stub, [header("no-such-session", codec.meta_of(a))])
    stub.Release(rknn_pb2.ReleaseRequest(session_id=session_id), metadata=META)
    with expect(grpc.StatusCode.NOT_FOUND, session_id):
        stub.EvalPerf(rknn_pb2.EvalPerfRequest(session_id=session_id), metadata=META)
    with expect(grpc.StatusCode.NOT_FOUND):
        stub.Release(rknn_pb2.ReleaseRequest(session_id=session_id), metadata=META)


def test_unknown_model_hash(stub) -> None:
    with expect(grpc.StatusCode.NOT_FOUND, "not in the daemon's cache", "upload it first"):
        stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest="0" * 64), metadata=META)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "64 lower-case hex"):
        stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest="../../etc/passwd"), metadata=META)


def _manifest_for(data: bytes, name: str = "m.onnx", sha: str | None = None) -> rknn_pb2.ModelManifest:
    entry = manifest.FileEntry(name, len(data), sha or hashlib.sha256(data).hexdigest())
    return rknn_pb2.ModelManifest(
        digest=manifest.manifest_digest([entry]),
        files=[rknn_pb2.ModelFile(name=entry.name, size=entry.size, sha256=entry.sha256)],
    )


def _upload(stub, man: rknn_pb2.ModelManifest, data: bytes, offset: int = 0) -> rknn_pb2.UploadModelResponse:
    messages = [
        rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=man, start_offsets=[offset])),
        rknn_pb2.UploadModelRequest(chunk=rknn_pb2.UploadChunk(file_index=0, offset=offset, data=data)),
    ]
    return stub.UploadModel(iter(messages), metadata=META)


def test_upload_whose_bytes_do_not_match_the_hash(stub) -> None:
    claimed = os.urandom(64)
    man = _manifest_for(claimed)
    with expect(grpc.StatusCode.DATA_LOSS, "hash to", "declared sha256"):
        _upload(stub, man, os.urandom(64))
    assert not stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=man), metadata=META).cached


def test_truncated_upload_is_kept_and_resumes(stub) -> None:
    data = os.urandom(5000)
    man = _manifest_for(data)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "3000 of 5000", "kept for resume"):
        _upload(stub, man, data[:3000])
    prepared = stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=man), metadata=META)
    assert list(prepared.held_bytes) == [3000] and not prepared.cached
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "holds [3000]"):
        _upload(stub, man, data, offset=0)
    reply = _upload(stub, man, data[3000:], offset=3000)
    assert reply.received_bytes == 2000
    assert stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=man), metadata=META).cached


def test_manifest_lies_and_absurd_sizes(stub) -> None:
    man = _manifest_for(b"abc")
    man.digest = "f" * 64
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "does not match its file list"):
        stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=man), metadata=META)
    traversal = _manifest_for(b"abc", name="../escape.onnx")
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "not allowed"):
        stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=traversal), metadata=META)
    huge = rknn_pb2.ModelManifest(files=[rknn_pb2.ModelFile(name="big.onnx", size=1 << 60, sha256="a" * 64)])
    huge.digest = manifest.manifest_digest(manifest.entries_of(huge))
    with expect(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_model_bytes"):
        stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=huge), metadata=META)


def test_a_file_that_is_not_a_model(stub, host_daemon: DaemonProcess, tmp_path: Path) -> None:
    junk = os.urandom(4096)
    man = _manifest_for(junk, name="junk.onnx")
    _upload(stub, man, junk)
    with expect(grpc.StatusCode.FAILED_PRECONDITION, "junk.onnx is not a loadable ONNX model"):
        stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest=man.digest), metadata=META)
    (tmp_path / "junk.onnx").write_bytes(junk)
    with connect(host_daemon.url) as device, pytest.raises(ValueError, match="not a readable ONNX model"):
        device.load(tmp_path / "junk.onnx")


def test_bad_core_mask_and_fallback(stub, host_daemon: DaemonProcess, cnn_model: Path) -> None:
    with connect(host_daemon.url) as device:
        digest = device.upload(cnn_model).digest
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "0x5", "not an NPU core mask"):
        stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest=digest, core_mask=5), metadata=META)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "'tpu'"):
        stub.InitRuntime(
            rknn_pb2.InitRuntimeRequest(model_digest=digest, fallback_prior_device="tpu"), metadata=META
        )


def test_too_old_client_protocol_is_refused_with_both_versions(stub) -> None:
    with expect(grpc.StatusCode.FAILED_PRECONDITION, "client protocol version 0", "upgrade rknn_client"):
        stub.GetInfo(rknn_pb2.GetInfoRequest(), metadata=((PROTOCOL_VERSION_METADATA_KEY, "0"),))


CLIENT_THAT_DIES = textwrap.dedent(
    """
    import os, sys, grpc, numpy as np
    from rknn_proto import codec, rknn_pb2, rknn_pb2_grpc
    stub = rknn_pb2_grpc.RknnServerStub(grpc.insecure_channel(sys.argv[1]))
    what = sys.argv[2]
    def requests():
        if what == "upload":
            man = rknn_pb2.ModelManifest(digest=sys.argv[3], files=[rknn_pb2.ModelFile(name="m.onnx", size=int(sys.argv[4]), sha256=sys.argv[5])])
            yield rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=man, start_offsets=[0]))
            yield rknn_pb2.UploadModelRequest(chunk=rknn_pb2.UploadChunk(file_index=0, offset=0, data=b"x" * 1000))
        else:
            a = np.zeros((1, 3, 16, 16), dtype=np.float32)
            yield rknn_pb2.InferenceRequest(header=rknn_pb2.InferenceHeader(session_id=sys.argv[3], inputs=[codec.meta_of(a)]))
            yield rknn_pb2.InferenceRequest(chunk=rknn_pb2.TensorChunk(tensor_index=0, offset=0, data=b"\\0" * 100))
        print("sent", flush=True)
        os._exit(0)
    call = stub.UploadModel(requests()) if what == "upload" else stub.Inference(requests())
    list(call) if what != "upload" else None
    """
)


@pytest.mark.parametrize("what", ["upload", "inference"])
def test_a_client_that_disconnects_mid_stream(
    host_daemon: DaemonProcess, stub, session_id: str, what: str
) -> None:
    data = os.urandom(2000)
    man = _manifest_for(data)
    args = [man.digest, str(len(data)), man.files[0].sha256] if what == "upload" else [session_id]
    result = subprocess.run(
        [sys.executable, "-c", CLIENT_THAT_DIES, host_daemon.address, what, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "sent" in result.stdout, result.stderr
    info = stub.GetInfo(rknn_pb2.GetInfoRequest())
    assert info.daemon_version
    a = good_input()
    chunk = rknn_pb2.TensorChunk(tensor_index=0, offset=0, data=a.tobytes())
    responses = inference(
        stub, [header(session_id, codec.meta_of(a)), rknn_pb2.InferenceRequest(chunk=chunk)]
    )
    assert responses[0].header.outputs[0].shape == [1, 10]


def test_unary_run_checks_like_the_stream(stub, session_id: str) -> None:
    a = good_input()
    head = rknn_pb2.InferenceHeader(session_id=session_id, inputs=[codec.meta_of(a)])
    reply = stub.Run(rknn_pb2.RunRequest(header=head, inputs=[a.tobytes()]), metadata=META)
    assert list(reply.header.outputs[0].shape) == [1, 10] and len(reply.outputs[0]) == 40
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "2 input byte strings", "1 declared"):
        stub.Run(rknn_pb2.RunRequest(header=head, inputs=[a.tobytes(), b""]), metadata=META)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "stream ended", "100 of 3072"):
        stub.Run(rknn_pb2.RunRequest(header=head, inputs=[a.tobytes()[:100]]), metadata=META)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "declared 3072"):
        stub.Run(rknn_pb2.RunRequest(header=head, inputs=[a.tobytes() + b"\0"]), metadata=META)


def test_unary_run_answers_outputs_larger_than_a_stream_message(
    host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A Run whose outputs were computed is never refused for their size (a client picks Run for
    outputs of unknown size): 5 MiB of outputs, over the 4 MiB a stream message carries, come whole."""
    model = models.big_identity(tmp_path / "five_mib.onnx", 5 * (1 << 20) // 4)
    with connect(host_daemon.url) as device, device.load(model) as session:
        x = np.arange(5 * (1 << 20) // 4, dtype=np.float32).reshape(1, -1)
        head = rknn_pb2.InferenceHeader(session_id=session.id, inputs=[codec.meta_of(x)])
        with grpc.insecure_channel(
            host_daemon.address,
            options=[
                ("grpc.max_send_message_length", 8 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
            ],
        ) as ch:
            raw = rknn_pb2_grpc.RknnServerStub(ch)
            reply = raw.Run(rknn_pb2.RunRequest(header=head, inputs=[x.tobytes()]), metadata=META)
        assert reply.outputs[0] == x.tobytes()
