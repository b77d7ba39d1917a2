"""Replies too large for their door (security findings 6 and 7), against a live daemon.

One rule bounds every reply (server/kit/replies.py): a REST reply as JSON (many times its tensor's
bytes), as binary data, and a v2 gRPC reply are held to --max-message-bytes and the memory budget,
refused before compute where the model says how large the outputs are, after it otherwise. A shape
whose dimensions do not fit a 64-bit integer is a 400 / INVALID_ARGUMENT naming it, never a 500.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon
from tests.models import big_identity, expand, shape_input_bomb

MIB = 1 << 20
MAX_MESSAGE = 80 * MIB
SMALL = 32 * MIB // 4  # float32 elements of a 32 MiB output
HUGE = 96 * MIB // 4  # over --max-message-bytes even as binary
ROUND_TRIP = 64 * MIB // 4  # over the old 8 MiB cap of v2 gRPC replies, within --max-message-bytes
# A refused reply must not cost the daemon anything near the output's size (JSON cost it ~14x).
REFUSED_GROWTH = 16 * MIB


def repository(folder: Path) -> Path:
    root = folder / "repository"
    for name in ("expand32", "expand96", "identity64", "dynamic"):
        (root / name).mkdir(parents=True)
    expand(root / "expand32" / "model.onnx", SMALL)
    expand(root / "expand96" / "model.onnx", HUGE)
    big_identity(root / "identity64" / "model.onnx", ROUND_TRIP)
    shape_input_bomb(root / "dynamic" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    folder = tmp_path_factory.mktemp("replies")
    running = start_metrics_daemon(
        folder, "--model-repository", str(repository(folder)), "--max-message-bytes", str(MAX_MESSAGE)
    )
    yield running
    assert running.daemon.stop() == 0


class Peak:
    """The daemon's peak resident memory over a block (VmHWM, reset first), read from /proc."""

    def __init__(self, pid: int) -> None:
        self.status = Path(f"/proc/{pid}/status")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.start = self._read("VmRSS")

    def _read(self, key: str) -> int:
        for line in self.status.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {key} in {self.status}")

    @property
    def growth(self) -> int:
        return self._read("VmHWM") - self.start


def post(
    running: MetricsDaemon, model: str, header: dict[str, object]
) -> tuple[int, dict[str, object], bytes]:
    """(status, JSON header, binary data after it) of a v2 REST inference."""
    request = urllib.request.Request(
        f"{running.base}/v2/models/{model}/infer", data=json.dumps(header).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            body, length = reply.read(), reply.headers.get("Inference-Header-Content-Length")
            status = reply.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), b""
    split = int(length) if length is not None else len(body)
    return status, json.loads(body[:split]), body[split:]


def one_input(name: str, datatype: str, shape: list[int], data: list[object]) -> dict[str, object]:
    return {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}


def stub(running: MetricsDaemon) -> tuple[grpc.Channel, pb_grpc.GRPCInferenceServiceStub]:
    big = 2 * MAX_MESSAGE
    channel = grpc.insecure_channel(
        running.daemon.address,
        options=[("grpc.max_receive_message_length", big), ("grpc.max_send_message_length", big)],
    )
    return channel, pb_grpc.GRPCInferenceServiceStub(channel)


def test_a_json_reply_too_large_is_refused_before_compute_at_little_memory(daemon: MetricsDaemon) -> None:
    peak = Peak(daemon.daemon.pid)
    status, body, _ = post(daemon, "expand32", one_input("x", "FP32", [1], [1.0]))
    assert status == 413, body
    error = str(body["error"])
    assert "'y'" in error and str(SMALL * 4) in error and str(MAX_MESSAGE) in error, error
    assert "binary_data" in error and "gRPC" in error, error
    assert peak.growth < REFUSED_GROWTH, f"the daemon grew {peak.growth >> 20} MiB for a refused reply"


def test_the_same_output_as_binary_data_comes_back(daemon: MetricsDaemon) -> None:
    header = {
        **one_input("x", "FP32", [1], [2.5]),
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    status, body, data = post(daemon, "expand32", header)
    assert status == 200, body
    assert body["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [SMALL], "parameters": {"binary_data_size": SMALL * 4}}
    ]
    found = np.frombuffer(data, np.float32)
    assert found.shape == (SMALL,) and np.all(found == 2.5)


def test_a_binary_reply_over_the_message_limit_is_refused_before_compute(daemon: MetricsDaemon) -> None:
    peak = Peak(daemon.daemon.pid)
    header = {**one_input("x", "FP32", [1], [1.0]), "parameters": {"binary_data_output": True}}
    status, body, _ = post(daemon, "expand96", header)
    assert status == 413 and str(HUGE * 4) in str(body["error"]), body
    assert peak.growth < REFUSED_GROWTH, f"the daemon grew {peak.growth >> 20} MiB for a refused reply"


def test_a_json_reply_of_unknown_size_is_refused_after_compute_without_encoding_it(
    daemon: MetricsDaemon,
) -> None:
    peak = Peak(daemon.daemon.pid)
    status, body, _ = post(daemon, "dynamic", one_input("shape", "INT64", [1], [SMALL]))
    assert status == 413 and "binary_data" in str(body["error"]), body
    # The output itself was computed (32 MiB); its JSON (~14x that) never was.
    assert peak.growth < 3 * SMALL * 4, f"the daemon grew {peak.growth >> 20} MiB"
    status, body, _ = post(daemon, "dynamic", one_input("shape", "INT64", [1], [3]))
    assert status == 200 and body["outputs"][0]["data"] == [1.0, 1.0, 1.0], body  # type: ignore[index]


def test_a_v2_grpc_reply_over_the_old_8_mib_cap_within_the_limit_works(daemon: MetricsDaemon) -> None:
    data = np.random.default_rng(0).standard_normal((1, ROUND_TRIP)).astype(np.float32)
    request = pb.ModelInferRequest(
        model_name="identity64",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, ROUND_TRIP])],
        raw_input_contents=[data.tobytes()],
    )
    channel, v2 = stub(daemon)
    with channel:
        reply = v2.ModelInfer(request, timeout=120)
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [("y", "FP32", [1, ROUND_TRIP])]
    assert reply.raw_output_contents[0] == data.tobytes()


def test_a_v2_grpc_reply_over_the_limit_is_refused_before_compute(daemon: MetricsDaemon) -> None:
    peak = Peak(daemon.daemon.pid)
    request = pb.ModelInferRequest(
        model_name="expand96",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1])],
        raw_input_contents=[np.float32(1).tobytes()],
    )
    channel, v2 = stub(daemon)
    with channel, pytest.raises(grpc.RpcError) as caught:
        v2.ModelInfer(request, timeout=120)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = caught.value.details() or ""
    assert "'y'" in details and str(HUGE * 4) in details and "--max-message-bytes" in details, details
    assert peak.growth < REFUSED_GROWTH, f"the daemon grew {peak.growth >> 20} MiB for a refused reply"


@pytest.mark.parametrize("shape", [[10**30], [2**63], [2, 2**62], [2**62, 2**62]], ids=str)
def test_a_rest_shape_beyond_int64_is_a_400_naming_it(daemon: MetricsDaemon, shape: list[int]) -> None:
    header = {**one_input("x", "FP32", shape, [1.0]), "parameters": {"binary_data_output": True}}
    status, body, _ = post(daemon, "expand32", header)
    assert status == 400, body
    assert str(shape[-1]) in str(body["error"]) and "'x'" in str(body["error"]), body


@pytest.mark.parametrize("shape", [[2, 2**62], [2**62, 2**62], [2**31, 2**31, 2**31]], ids=str)
def test_a_grpc_shape_beyond_int64_is_invalid_argument_naming_it(
    daemon: MetricsDaemon, shape: list[int]
) -> None:
    request = pb.ModelInferRequest(
        model_name="expand32",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=shape)],
        raw_input_contents=[np.float32(1).tobytes()],
    )
    channel, v2 = stub(daemon)
    with channel, pytest.raises(grpc.RpcError) as caught:
        v2.ModelInfer(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert str(shape[-1]) in (caught.value.details() or "")


def test_a_reply_over_the_memory_budget_is_refused_before_compute(tmp_path: Path) -> None:
    budget = 16 * MIB
    running = start_metrics_daemon(
        tmp_path,
        "--model-repository",
        str(repository(tmp_path)),
        "--max-message-bytes",
        str(MAX_MESSAGE),
        "--max-memory",
        str(budget),
    )
    try:
        header = {**one_input("x", "FP32", [1], [1.0]), "parameters": {"binary_data_output": True}}
        status, body, _ = post(running, "expand32", header)
        assert status == 413 and f"--max-memory {budget}" in str(body["error"]), body
        status, body, _ = post(running, "dynamic", {**header, **one_input("shape", "INT64", [1], [4])})
        assert status == 200 and body["outputs"][0]["parameters"] == {"binary_data_size": 16}, body  # type: ignore[index]
    finally:
        assert running.daemon.stop() == 0
