"""Triton's system shared-memory extension (issue #30): the real tritonclient registers POSIX
shared-memory regions and runs with inputs and outputs in them; perf_analyzer --shared-memory=system
measures; and the extension keeps the daemon's own regions' rules (a caller's own regular file, its
windows checked, another tenant's regions unknown, a truncated file a clear error, never a crash)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from tests.conftest import onnx_reference
from tests.kserve.conftest import V2Daemon
from tests.kserve.tritonclient_venv import PerfAnalyzer
from tests.reliability.conftest import OTHER_TOKEN, TOKEN
from tests.reliability.test_tenancy import md, start

SHM = Path("/dev/shm")
IMAGE = np.random.default_rng(11).standard_normal((1, 3, 16, 16)).astype(np.float32)


def unique(tag: str) -> str:
    return f"rknn-test-{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def shm_file() -> Iterator[Callable[[bytes], str]]:
    """Files of /dev/shm made for a test (removed after it): the object key of each."""
    made: list[Path] = []

    def make(data: bytes) -> str:
        path = SHM / unique("region")
        path.write_bytes(data)
        made.append(path)
        return f"/{path.name}"

    yield make
    for path in made:
        path.unlink(missing_ok=True)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
@pytest.mark.parametrize("protocol", ["grpc", "http-binary"])
def test_tritonclient_runs_with_inputs_and_outputs_in_system_shared_memory(
    v2_daemon: V2Daemon, protocol: str
) -> None:
    inputs, out = v2_daemon.folder / "shm-in.npz", v2_daemon.folder / "shm-out.npz"
    np.savez(inputs, input=IMAGE)
    answer = v2_daemon.one(
        {
            "op": "shm_infer",
            "protocol": protocol,
            "model": "cnn",
            "prefix": unique("tc"),
            "inputs": str(inputs),
            "outputs": {"logits": 40},
            "out": str(out),
        }
    )
    assert "ok" in answer, answer
    with np.load(out) as got:
        logits = got["logits"]
    expected = onnx_reference(v2_daemon.folder / "repository" / "cnn" / "model.onnx")([IMAGE])[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)

    def regions(status: Any) -> list[dict[str, Any]]:  # HTTP answers a list, gRPC a map (its JSON)
        return status if isinstance(status, list) else list(status.get("regions", {}).values())

    registered = regions(answer["ok"]["status"])
    assert sorted(int(r["byte_size"]) for r in registered) == [
        40,
        IMAGE.nbytes,
    ]  # gRPC's JSON int64s: strings
    assert regions(answer["ok"]["after"]) == []  # unregister with no name: all of them


def stub_of(address: str) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details() or ""


def infer_from(
    region: str, byte_size: int, offset: int = 0, out: str = "", out_offset: int = 0
) -> pb.ModelInferRequest:
    """The cnn's inference with its input in `region` (and its output in `out` at `out_offset`)."""
    parameters = {
        "shared_memory_region": pb.InferParameter(string_param=region),
        "shared_memory_byte_size": pb.InferParameter(int64_param=byte_size),
        "shared_memory_offset": pb.InferParameter(int64_param=offset),
    }
    outputs = []
    if out:
        outputs.append(
            pb.ModelInferRequest.InferRequestedOutputTensor(
                name="logits",
                parameters={
                    "shared_memory_region": pb.InferParameter(string_param=out),
                    "shared_memory_byte_size": pb.InferParameter(int64_param=40),
                    "shared_memory_offset": pb.InferParameter(int64_param=out_offset),
                },
            )
        )
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=IMAGE.shape, parameters=parameters
    )
    return pb.ModelInferRequest(model_name="cnn", inputs=[tensor], outputs=outputs)


def test_windows_sizes_and_owners_are_checked(v2_daemon: V2Daemon, shm_file: Callable[[bytes], str]) -> None:
    stub = stub_of(v2_daemon.grpc)
    padding = b"\0" * 64
    key = shm_file(padding + IMAGE.tobytes() + bytes(40))
    name = unique("win")
    register = pb.SystemSharedMemoryRegisterRequest
    assert (
        refusal(
            lambda: stub.SystemSharedMemoryRegister(register(name=name, key="/../etc/passwd", byte_size=8))
        )[0]
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    code, text = refusal(
        lambda: stub.SystemSharedMemoryRegister(register(name=name, key=key, offset=64, byte_size=10**9))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "do not fit" in text
    others = SHM / unique("other")
    others.write_bytes(bytes(64))
    try:
        os.chown(others, 12345, 12345)
        code, text = refusal(
            lambda: stub.SystemSharedMemoryRegister(register(name=name, key=f"/{others.name}", byte_size=64))
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED and "another user" in text
    finally:
        others.unlink()

    # The window starts at offset 64: the input's bytes, then the output's slot.
    stub.SystemSharedMemoryRegister(register(name=name, key=key, offset=64, byte_size=IMAGE.nbytes + 40))
    try:
        reply = stub.ModelInfer(infer_from(name, IMAGE.nbytes, out=name, out_offset=IMAGE.nbytes))
        assert reply.raw_output_contents == [b""]  # the output went into the region, not the reply
        assert list(reply.outputs[0].shape) == [1, 10]
        data = (SHM / key[1:]).read_bytes()
        expected = onnx_reference(v2_daemon.folder / "repository" / "cnn" / "model.onnx")([IMAGE])[0]
        np.testing.assert_allclose(
            np.frombuffer(data[64 + IMAGE.nbytes :], np.float32), expected.ravel(), rtol=1e-5, atol=1e-6
        )
        assert (
            data[:64] == padding and data[64 : 64 + IMAGE.nbytes] == IMAGE.tobytes()
        )  # nothing else written
        for request, message in (
            (infer_from(name, IMAGE.nbytes - 4), f"shared_memory_byte_size {IMAGE.nbytes - 4}"),
            (infer_from(name, IMAGE.nbytes, offset=41), "lie outside region"),
            (infer_from(name, IMAGE.nbytes, out=name, out_offset=IMAGE.nbytes + 4), "lie outside region"),
            (infer_from("nope", IMAGE.nbytes), "no system shared-memory region 'nope'"),
        ):
            code, text = refusal(lambda request=request: stub.ModelInfer(request))
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), text
            assert message in text
        os.truncate(SHM / key[1:], 100)  # the client shrinks its file under a registered region
        code, text = refusal(lambda: stub.ModelInfer(infer_from(name, IMAGE.nbytes)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "truncated after it was registered" in text
        assert stub.ServerLive(pb.ServerLiveRequest()).live  # and the daemon serves on
    finally:
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=name))
    assert name not in stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A daemon with Alice's and Bob's tokens (tests/reliability/test_tenancy.py): its address."""
    running = start(tmp_path_factory.mktemp("shm-tenancy"))
    yield running.daemon.address
    assert running.daemon.stop() == 0


def test_another_tenant_cannot_see_or_use_a_region(
    two_tenants: str, shm_file: Callable[[bytes], str]
) -> None:
    stub = stub_of(two_tenants)
    name, key = unique("alice"), shm_file(IMAGE.tobytes())
    stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=IMAGE.nbytes), metadata=md(TOKEN)
    )
    try:
        bobs = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), metadata=md(OTHER_TOKEN))
        assert name not in bobs.regions
        request = infer_from(name, IMAGE.nbytes)
        request.model_name = "cnn"
        code, text = refusal(lambda: stub.ModelInfer(request, metadata=md(OTHER_TOKEN)))
        assert code == grpc.StatusCode.NOT_FOUND and "no system shared-memory region" in text
        code, _ = refusal(
            lambda: stub.SystemSharedMemoryUnregister(
                pb.SystemSharedMemoryUnregisterRequest(name=name), metadata=md(OTHER_TOKEN)
            )
        )
        assert code == grpc.StatusCode.NOT_FOUND
        assert stub.ModelInfer(request, metadata=md(TOKEN)).raw_output_contents  # Alice's own works
    finally:
        stub.SystemSharedMemoryUnregister(
            pb.SystemSharedMemoryUnregisterRequest(name=name), metadata=md(TOKEN)
        )


def test_perf_analyzer_measures_with_system_shared_memory(
    perf_analyzer: PerfAnalyzer, v2_daemon: V2Daemon, tmp_path: Path
) -> None:
    measured = perf_analyzer.measure(
        tmp_path / "report.csv",
        *("-m", "cnn", "-u", v2_daemon.grpc, "-i", "grpc", "--shared-memory=system"),
        *("--output-shared-memory-size", "40", "--concurrency-range", "1:1"),
    )
    assert [row["Concurrency"] for row in measured] == ["1"] and float(measured[0]["Inferences/Second"]) > 0
    left = stub_of(v2_daemon.grpc).SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions
    assert not [name for name in left if "perf" in name.lower()]  # perf_analyzer unregistered its own
