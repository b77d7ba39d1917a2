"""The real tritonclient (gRPC and HTTP, its own venv) against a daemon subprocess: health, metadata,
inference on repository and uploaded models equal bit for bit to the rknn.v1 path, v2 errors."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from rknn_client import connect
from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from tests.kserve.conftest import V2Daemon
from tests.models import small_cnn

PROTOCOLS = ("grpc", "http-binary", "http-json")
rng = np.random.default_rng(7)
IMAGE = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
PAIR = {
    "first": rng.standard_normal((1, 4)).astype(np.float32),
    "second": rng.standard_normal((1, 4)).astype(np.float32),
}


def ours() -> dict[str, list[object]]:
    """Our descriptor in the driver's form."""
    found: dict[str, list[object]] = {}

    def walk(prefix: str, message) -> None:
        for field in message.fields:
            found[f"{prefix}.{field.name}"] = [field.number, field.type, bool(field.is_repeated)]
        for nested in message.nested_types:
            if not nested.GetOptions().map_entry:
                walk(f"{prefix}.{nested.name}", nested)

    for name, message in pb.DESCRIPTOR.message_types_by_name.items():
        walk(name, message)
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        found[f"rpc.{method.name}"] = [method.input_type.full_name, method.output_type.full_name]
    return found


def reference(daemon: V2Daemon, model: Path, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of the rknn.v1 path (rknn_client) for the same inputs."""
    with connect(daemon.running.daemon.url) as device, device.load(model) as session:
        return session.run(arrays)


def stub(daemon: V2Daemon) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(daemon.grpc))


def post(
    daemon: V2Daemon, route: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://{daemon.http}{route}", data=body, headers=headers or {}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_service_definition_matches_tritonclients(v2_daemon: V2Daemon) -> None:
    theirs = v2_daemon.one({"op": "descriptor"})["ok"]
    mine = ours()
    assert {k: theirs.get(k) for k in mine} == mine  # every field and RPC we define, as Triton numbers it


@pytest.mark.parametrize("protocol", ["grpc", "http-json"])
def test_health_and_metadata(v2_daemon: V2Daemon, protocol: str) -> None:
    steps = [
        {"op": "live"},
        {"op": "ready"},
        {"op": "server_metadata"},
        {"op": "model_ready", "model": "cnn"},
        {"op": "model_ready", "model": "nope"},
        {"op": "model_ready", "model": "broken"},
        {"op": "metadata", "model": "cnn"},
        {"op": "metadata", "model": "two"},
        {"op": "metadata", "model": "nhwc"},
    ]
    answers = v2_daemon.drive(*({**s, "protocol": protocol} for s in steps))
    live, ready, server, cnn_ready, nope_ready, broken_ready, cnn, two, nhwc = answers
    assert live == ready == cnn_ready == {"ok": True}
    assert nope_ready == broken_ready == {"ok": False}
    assert server["ok"]["name"] == "rknn_server" and "model_repository" in server["ok"]["extensions"]
    assert cnn["ok"]["platform"] == "onnxruntime_onnx" and cnn["ok"]["versions"] == ["1"]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in cnn["ok"]["inputs"]] == [
        ("input", "FP32", [1, 3, 16, 16])
    ]
    assert [(t["name"], t["datatype"]) for t in cnn["ok"]["outputs"]] == [("logits", "FP32")]
    # config.toml renames inputs, and shows the shape in the layout clients send.
    assert [t["name"] for t in two["ok"]["inputs"]] == ["first", "second"]
    assert [(t["name"], t["datatype"]) for t in two["ok"]["outputs"]] == [("y", "FP32"), ("shape", "INT64")]
    assert [int(d) for d in nhwc["ok"]["inputs"][0]["shape"]] == [1, 16, 16, 3]


@pytest.mark.parametrize("protocol", ["grpc", "http-json"])
def test_model_config_and_statistics(v2_daemon: V2Daemon, protocol: str) -> None:
    """Triton's ModelConfig and ModelStatistics (what perf_analyzer reads), as tritonclient decodes them."""

    def tensors(items: list[dict]) -> list[tuple[str, str, list[int]]]:
        return [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in items]

    def success(answer: dict) -> tuple[int, int, int]:
        (stats,) = answer["ok"]["model_stats"]
        assert stats["name"] == "nhwc" and stats["version"] == "1"
        done = stats["inference_stats"]["success"]
        return int(stats.get("inference_count", 0)), int(done.get("count", 0)), int(done.get("ns", 0))

    config, before = v2_daemon.drive(
        {"op": "config", "model": "nhwc", "protocol": protocol},
        {"op": "stats", "model": "nhwc", "protocol": protocol},
    )
    assert config["ok"]["name"] == "nhwc" and config["ok"]["platform"] == "onnxruntime_onnx"
    assert int(config["ok"].get("max_batch_size", 0)) == 0  # (gRPC's JSON leaves out a zero)
    # the shape clients send (config.toml's NHWC), whole: there is no batching
    assert tensors(config["ok"]["input"]) == [("input", "TYPE_FP32", [1, 16, 16, 3])]
    assert [t[:2] for t in tensors(config["ok"]["output"])] == [("logits", "TYPE_FP32")]
    image = IMAGE.transpose(0, 2, 3, 1).copy()
    for _ in range(3):
        v2_daemon.infer("nhwc", protocol, {"input": image})
    after = v2_daemon.one({"op": "stats", "model": "nhwc", "protocol": protocol})
    (count0, success0, ns0), (count1, success1, ns1) = success(before), success(after)
    assert count1 - count0 == success1 - success0 == 3 and ns1 > ns0
    unknown = v2_daemon.one({"op": "config", "model": "nope", "protocol": protocol})
    assert "unknown model 'nope'" in unknown["error"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inference_equals_the_rknn_v1_path(v2_daemon: V2Daemon, protocol: str) -> None:
    repository = v2_daemon.folder / "repository"
    expected = reference(v2_daemon, repository / "cnn" / "model.onnx", [IMAGE])
    found = v2_daemon.infer("cnn", protocol, {"input": IMAGE})
    assert found["logits"].dtype == expected[0].dtype and found["logits"].tobytes() == expected[0].tobytes()

    expected = reference(v2_daemon, repository / "two" / "model.onnx", [PAIR["first"], PAIR["second"]])
    found = v2_daemon.infer("two", protocol, PAIR)
    assert [found["y"].tobytes(), found["shape"].tobytes()] == [a.tobytes() for a in expected]
    assert found["shape"].dtype == np.int64
    only = v2_daemon.infer("two", protocol, PAIR, outputs=["shape"])
    assert list(only) == ["shape"]

    # NHWC data for an NCHW model whose config.toml says clients send NHWC: one transpose, same result.
    expected = reference(v2_daemon, repository / "nhwc" / "model.onnx", [IMAGE])
    found = v2_daemon.infer("nhwc", protocol, {"input": np.ascontiguousarray(IMAGE.transpose(0, 2, 3, 1))})
    assert found["logits"].tobytes() == expected[0].tobytes()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_uploaded_model_is_named_by_its_digest(v2_daemon: V2Daemon, protocol: str, tmp_path: Path) -> None:
    model = small_cnn(tmp_path / "uploaded.onnx", seed=5)
    with connect(v2_daemon.running.daemon.url) as device:
        digest = device.upload(model).digest
    expected = reference(v2_daemon, model, [IMAGE])
    assert v2_daemon.one({"op": "model_ready", "model": digest, "protocol": protocol}) == {"ok": True}
    assert v2_daemon.infer(digest, protocol, {"input": IMAGE})["logits"].tobytes() == expected[0].tobytes()


def test_tensor_contents_work_like_raw_contents(v2_daemon: V2Daemon) -> None:
    """tritonclient sends raw_input_contents; other v2 clients send typed contents."""
    raw = stub(v2_daemon).ModelInfer(
        pb.ModelInferRequest(
            model_name="two",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(name=n, datatype="FP32", shape=[1, 4]) for n in PAIR
            ],
            raw_input_contents=[a.tobytes() for a in PAIR.values()],
        )
    )
    typed = stub(v2_daemon).ModelInfer(
        pb.ModelInferRequest(
            model_name="two",
            id="request-7",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name=n,
                    datatype="FP32",
                    shape=[1, 4],
                    contents=pb.InferTensorContents(fp32_contents=a.ravel().tolist()),
                )
                for n, a in PAIR.items()
            ],
        )
    )
    assert typed.raw_output_contents == raw.raw_output_contents and typed.id == "request-7"
    assert [(o.name, o.datatype, list(o.shape)) for o in typed.outputs] == [
        ("y", "FP32", [1, 4]),
        ("shape", "INT64", [2]),
    ]


def test_bad_requests_get_v2_errors_and_the_daemon_keeps_serving(v2_daemon: V2Daemon) -> None:
    inputs, out = v2_daemon.folder / "bad.npz", v2_daemon.folder / "bad-out.npz"

    def attempt(model: str, protocol: str, **arrays: np.ndarray) -> dict:
        path = inputs.with_name(f"bad-{len(list(v2_daemon.folder.glob('bad-*.npz')))}.npz")
        np.savez(path, **arrays)
        return {"op": "infer", "model": model, "protocol": protocol, "inputs": str(path), "out": str(out)}

    cases = [
        (
            "unknown model",
            attempt("nope", "grpc", input=IMAGE),
            "StatusCode.NOT_FOUND",
            "unknown model 'nope'",
        ),
        ("unknown model", attempt("nope", "http-binary", input=IMAGE), "404", "unknown model 'nope'"),
        (
            "wrong datatype",
            attempt("cnn", "grpc", input=IMAGE.astype(np.int32)),
            "StatusCode.INVALID_ARGUMENT",
            "expects float32",
        ),
        (
            "wrong datatype",
            attempt("cnn", "http-json", input=IMAGE.astype(np.int32)),
            "400",
            "expects float32",
        ),
        (
            "shape mismatch",
            attempt("cnn", "grpc", input=IMAGE[..., :8].copy()),
            "StatusCode.INVALID_ARGUMENT",
            "[1, 3, 16, 8]",
        ),
        (
            "shape mismatch",
            attempt("cnn", "http-binary", input=IMAGE[..., :8].copy()),
            "400",
            "[1, 3, 16, 8]",
        ),
        (
            "missing input",
            attempt("two", "grpc", first=PAIR["first"]),
            "StatusCode.INVALID_ARGUMENT",
            "second missing",
        ),
        ("missing input", attempt("two", "http-json", first=PAIR["first"]), "400", "second missing"),
        (
            "unknown input",
            attempt("two", "grpc", first=PAIR["first"], third=PAIR["second"]),
            "StatusCode.INVALID_ARGUMENT",
            "no input 'third'",
        ),
        ("not ready", attempt("broken", "grpc", input=IMAGE), "StatusCode.UNAVAILABLE", "not ready"),
    ]
    answers = v2_daemon.drive(*(step for _, step, _, _ in cases))
    for (what, _, status, text), answer in zip(cases, answers, strict=True):
        assert answer.get("status") == status and text in answer["error"], (what, answer)

    # Raw contents larger than the declared shape: refused before anything runs (gRPC, then HTTP).
    with pytest.raises(grpc.RpcError) as caught:
        stub(v2_daemon).ModelInfer(
            pb.ModelInferRequest(
                model_name="cnn",
                inputs=[
                    pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 3, 16, 16])
                ],
                raw_input_contents=[IMAGE.tobytes() + b"\0" * 4096],
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected 3072 bytes" in caught.value.details()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 3, 16, 16],
                    "parameters": {"binary_data_size": 3072},
                }
            ]
        }
    ).encode()
    status, body = post(
        v2_daemon,
        "/v2/models/cnn/infer",
        header + IMAGE.tobytes() + b"\0" * 64,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400 and "binary data" in body["error"]
    status, body = post(v2_daemon, "/v2/models/cnn/infer", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]
    status, body = post(v2_daemon, "/v2/models/cnn/versions/2/infer", b"{}")
    assert status == 404 and "no version '2'" in body["error"]
    # BYTES is refused clearly.
    with pytest.raises(grpc.RpcError) as caught:
        stub(v2_daemon).ModelInfer(
            pb.ModelInferRequest(
                model_name="cnn",
                inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="BYTES", shape=[1])],
                raw_input_contents=[b"abcd"],
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "BYTES" in caught.value.details()

    # Still serving, over both protocols.
    assert v2_daemon.running.daemon.process.poll() is None
    assert v2_daemon.infer("cnn", "grpc", {"input": IMAGE})["logits"].shape == (1, 10)
    assert v2_daemon.infer("cnn", "http-binary", {"input": IMAGE})["logits"].shape == (1, 10)


def test_repository_index_unload_and_load(v2_daemon: V2Daemon) -> None:
    index = {row["name"]: row for row in v2_daemon.one({"op": "index"})["ok"]}
    assert {n: index[n]["state"] for n in ("cnn", "two", "nhwc", "spare", "broken")} == {
        "cnn": "READY",
        "two": "READY",
        "nhwc": "READY",
        "spare": "READY",
        "broken": "UNAVAILABLE",
    }
    assert index["broken"]["reason"] and "/" not in index["broken"]["reason"]  # no server path
    for protocol in ("grpc", "http-json"):
        first, second = v2_daemon.drive(
            {"op": "unload", "model": "spare", "protocol": protocol},
            {"op": "model_ready", "model": "spare", "protocol": protocol},
        )
        assert first == {"ok": True} and second == {"ok": False}
        np.savez(v2_daemon.folder / "spare.npz", a=PAIR["first"], b=PAIR["second"])
        refused = v2_daemon.one(
            {
                "op": "infer",
                "model": "spare",
                "protocol": protocol,
                "inputs": str(v2_daemon.folder / "spare.npz"),
                "out": str(v2_daemon.folder / "x.npz"),
            }
        )
        assert refused["status"] in ("StatusCode.UNAVAILABLE", "503") and "unloaded" in refused["error"]
        assert v2_daemon.one({"op": "load", "model": "spare", "protocol": protocol}) == {"ok": True}
        assert v2_daemon.infer("spare", protocol, {"a": PAIR["first"], "b": PAIR["second"]})["y"].shape == (
            1,
            4,
        )
    missing = v2_daemon.one({"op": "load", "model": "nothing-here"})
    assert missing["status"] == "StatusCode.NOT_FOUND"


def raw_http(daemon: V2Daemon, data: bytes) -> bytes:
    """Send bytes to the HTTP listener, end the request stream, and read the whole answer."""
    host, _, port = daemon.http.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_the_http_listener_bounds_request_bodies(v2_daemon: V2Daemon) -> None:
    infer = b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\n"
    too_big = raw_http(v2_daemon, infer + b"Content-Length: 100000000\r\n\r\n")
    assert too_big.startswith(b"HTTP/1.1 413 ") and b"over the limit" in too_big
    assert raw_http(v2_daemon, infer + b"\r\n").startswith(b"HTTP/1.1 411 ")
    cut = raw_http(v2_daemon, infer + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{}")
    assert cut.startswith(b"HTTP/1.1 400 ") and b"cut after 2 bytes" in cut
    both = raw_http(v2_daemon, infer + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert both.startswith(b"HTTP/1.1 400 ") and b"not both" in both
    short = raw_http(v2_daemon, infer + b"Content-Length: 100\r\n\r\n{}")
    assert short.startswith(b"HTTP/1.1 400 ") and b"ended after 2 of its 100 bytes" in short
    # POST only where a body is taken; GET where it is not.
    assert raw_http(v2_daemon, b"POST /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").startswith(
        b"HTTP/1.1 405 "
    )
    assert raw_http(v2_daemon, b"GET /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
        b"HTTP/1.1 405 "
    )
    assert v2_daemon.infer("cnn", "http-json", {"input": IMAGE})["logits"].shape == (1, 10)
