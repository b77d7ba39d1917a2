"""64 MiB tensors over KServe v2 (issue #30): they round-trip byte-exact over gRPC and over REST's binary
tensor data (`Inference-Header-Content-Length`), with our stubs and the real tritonclient, bounded only
by the daemon's --max-message-bytes; a reply over that limit, or over the memory budget, is refused
before compute by the one reply rule (server/kit/replies.py), naming the limit and its flag, and a request
over it is still refused before it is buffered."""

from __future__ import annotations

import http.client
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
from tests.kserve.conftest import V2Daemon
from tests.metrics.conftest import MetricsDaemon, samples, scrape, start_metrics_daemon
from tests.models import big_identity, expand

MIB = 1 << 20
ELEMENTS = 64 * MIB // 4  # float32 values of a 64 MiB tensor
MAX_MESSAGE = 80 * MIB  # room for a 64 MiB request and its reply
SMALL_LIMIT = 16 * MIB  # under the 64 MiB reply: the refusing daemons' limit
HEADER_LENGTH = "Inference-Header-Content-Length"


def repository(folder: Path) -> Path:
    """identity64 (64 MiB in, 64 MiB out), expand64 (4 bytes in, 64 MiB out), tiny (4 bytes in, 16 out)."""
    root = folder / "repository"
    for name in ("identity64", "expand64", "tiny"):
        (root / name).mkdir(parents=True)
    big_identity(root / "identity64" / "model.onnx", ELEMENTS)
    expand(root / "expand64" / "model.onnx", ELEMENTS)
    expand(root / "tiny" / "model.onnx", 4)
    return root


def start(folder: Path, *args: str) -> MetricsDaemon:
    return start_metrics_daemon(folder, "--model-repository", str(repository(folder)), *args)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    running = start(tmp_path_factory.mktemp("roomy"), "--max-message-bytes", str(MAX_MESSAGE))
    yield running
    assert running.daemon.stop() == 0


@pytest.fixture(scope="module")
def over_message(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    """A daemon whose --max-message-bytes is under the 64 MiB reply."""
    running = start(tmp_path_factory.mktemp("over-message"), "--max-message-bytes", str(SMALL_LIMIT))
    yield running
    assert running.daemon.stop() == 0


@pytest.fixture(scope="module")
def over_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    """A daemon whose --max-message-bytes admits the 64 MiB reply and whose --max-memory does not."""
    running = start(
        tmp_path_factory.mktemp("over-memory"),
        "--max-message-bytes",
        str(MAX_MESSAGE),
        "--max-memory",
        str(SMALL_LIMIT),
    )
    yield running
    assert running.daemon.stop() == 0


# Each refusing daemon and the setting its refusal names.
NAMED = {"over_message": f"--max-message-bytes {SMALL_LIMIT}", "over_memory": f"--max-memory {SMALL_LIMIT}"}


def payload() -> np.ndarray:
    return np.random.default_rng(30).standard_normal((1, ELEMENTS)).astype(np.float32)


def v2_stub(running: MetricsDaemon) -> tuple[grpc.Channel, pb_grpc.GRPCInferenceServiceStub]:
    """A client that accepts messages far over the daemon's limit: the daemon's rule is what is tested."""
    big = 4 * MAX_MESSAGE
    channel = grpc.insecure_channel(
        running.daemon.address,
        options=[("grpc.max_receive_message_length", big), ("grpc.max_send_message_length", big)],
    )
    return channel, pb_grpc.GRPCInferenceServiceStub(channel)


def grpc_infer(running: MetricsDaemon, model: str, data: np.ndarray) -> pb.ModelInferResponse:
    request = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=list(data.shape))],
        raw_input_contents=[data.tobytes()],
    )
    channel, v2 = v2_stub(running)
    with channel:
        reply: pb.ModelInferResponse = v2.ModelInfer(request, timeout=120)
        return reply


def rest_infer(running: MetricsDaemon, model: str, data: np.ndarray) -> tuple[int, dict[str, object], bytes]:
    """(status, JSON header, binary data after it) of a v2 REST inference sending and asking for binary data."""
    header = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": list(data.shape),
                "parameters": {"binary_data_size": data.nbytes},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    request = urllib.request.Request(
        f"{running.base}/v2/models/{model}/infer",
        data=head + data.tobytes(),
        method="POST",
        headers={HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            body, length = reply.read(), reply.headers.get(HEADER_LENGTH)
            status = reply.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), b""
    split = int(length) if length is not None else len(body)
    return status, json.loads(body[:split]), body[split:]


def runs(running: MetricsDaemon) -> float:
    """Model runs the daemon computed, every model's together (rknn_model_compute_seconds' count)."""
    family = scrape(running.metrics_url).get("rknn_model_compute_seconds")
    if family is None:
        return 0.0
    return sum(samples(family, "rknn_model_compute_seconds_count").values())


def successes(running: MetricsDaemon, model: str) -> int:
    """The model's successful inferences as v2 ModelStatistics reports them."""
    channel, v2 = v2_stub(running)
    with channel:
        stats = v2.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=30)
    return int(stats.model_stats[0].inference_stats.success.count)


def test_a_64_mib_tensor_round_trips_over_v2_grpc(roomy: MetricsDaemon) -> None:
    data = payload()
    reply = grpc_infer(roomy, "identity64", data)
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [("y", "FP32", [1, ELEMENTS])]
    assert reply.raw_output_contents[0] == data.tobytes()


def test_a_64_mib_tensor_round_trips_over_rest_binary_data(roomy: MetricsDaemon) -> None:
    data = payload()
    status, header, binary = rest_infer(roomy, "identity64", data)
    assert status == 200, header
    assert header["outputs"] == [
        {
            "name": "y",
            "datatype": "FP32",
            "shape": [1, ELEMENTS],
            "parameters": {"binary_data_size": data.nbytes},
        }
    ]
    assert binary == data.tobytes()


@pytest.mark.parametrize("protocol", ["grpc", "http-binary"])
def test_the_real_tritonclient_round_trips_a_64_mib_tensor(
    roomy: MetricsDaemon, triton_python: Path, tmp_path: Path, protocol: str
) -> None:
    data = payload()
    found = V2Daemon(roomy, triton_python, tmp_path).infer("identity64", protocol, {"x": data})
    assert found["y"].dtype == np.float32 and found["y"].tobytes() == data.tobytes()


@pytest.mark.parametrize("daemon", sorted(NAMED))
def test_a_reply_over_the_limit_is_refused_before_compute_naming_it(
    request: pytest.FixtureRequest, daemon: str
) -> None:
    running: MetricsDaemon = request.getfixturevalue(daemon)
    named = NAMED[daemon]
    one = np.ones((1,), np.float32)
    before = runs(running)
    with pytest.raises(grpc.RpcError) as caught:
        grpc_infer(running, "expand64", one)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = caught.value.details() or ""
    assert "v2 gRPC reply" in details and str(ELEMENTS * 4) in details and named in details, details
    status, body, _ = rest_infer(running, "expand64", one)
    assert status == 413, body
    error = str(body["error"])
    assert "REST reply" in error and str(ELEMENTS * 4) in error and named in error, error
    # Nothing ran for either refusal; a run that fits is counted, so the count would have shown one.
    assert runs(running) == before and successes(running, "expand64") == 0
    status, body, binary = rest_infer(running, "tiny", one)
    assert status == 200 and np.frombuffer(binary, np.float32).tolist() == [1.0] * 4, body
    assert runs(running) == before + 1


def test_a_request_over_the_message_limit_is_refused_before_it_is_buffered(
    over_message: MetricsDaemon,
) -> None:
    before = runs(over_message)
    with pytest.raises(grpc.RpcError) as caught:
        grpc_infer(over_message, "identity64", payload())
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert str(SMALL_LIMIT) in (caught.value.details() or ""), caught.value.details()
    # REST answers from the head alone: its Content-Length is over the limit, no body byte is sent.
    connection = http.client.HTTPConnection(over_message.base.removeprefix("http://"), timeout=60)
    try:
        connection.putrequest("POST", "/v2/models/identity64/infer")
        connection.putheader("Content-Length", str(ELEMENTS * 4 + 200))
        connection.putheader(HEADER_LENGTH, "200")
        connection.endheaders()
        reply = connection.getresponse()
        status, text = reply.status, reply.read().decode()
    finally:
        connection.close()
    assert status == 413 and str(SMALL_LIMIT) in text and "--max-message-bytes" in text, text
    assert runs(over_message) == before
