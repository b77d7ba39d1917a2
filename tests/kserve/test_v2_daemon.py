"""The v2 protocol's place in the daemon: its auth on both ports, a model repository refused at start
when a folder is bad, and the bounded per-caller session pools."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from rknn_client import connect
from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from rknn_server.runtime.host import concurrent_runs
from rknn_server.testing import clean_environ
from tests.kserve.conftest import V2Daemon, start_v2_daemon
from tests.metrics.conftest import get, start_metrics_daemon
from tests.models import small_cnn
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt_cases import image_model, rknnrt_args

TOKEN = "kserve-token-0123456789abcdef"
IMAGE = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)


def test_v2_calls_need_the_token_on_both_ports(tmp_path: Path, triton_python: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"triton:{TOKEN}\n")
    tokens.chmod(0o600)
    daemon = start_v2_daemon(tmp_path, triton_python, "--auth-token-file", str(tokens))
    try:
        np.savez(tmp_path / "in.npz", input=IMAGE)
        infer = {
            "op": "infer",
            "model": "cnn",
            "inputs": str(tmp_path / "in.npz"),
            "out": str(tmp_path / "out.npz"),
        }
        answers = daemon.drive(
            {"op": "live"},
            {"op": "metadata", "model": "cnn"},
            {**infer, "protocol": "grpc"},
            {**infer, "protocol": "grpc", "token": "not-the-token-0123456789"},
            {"op": "metadata", "model": "cnn", "protocol": "http-json"},
            {**infer, "protocol": "http-binary"},
            {**infer, "protocol": "grpc", "token": TOKEN},
            {**infer, "protocol": "http-binary", "token": TOKEN},
            {"op": "metadata", "model": "cnn", "protocol": "http-json", "token": TOKEN},
        )
        refused, good = answers[:6], answers[6:]
        assert [a.get("status") for a in refused] == ["StatusCode.UNAUTHENTICATED"] * 4 + ["401"] * 2, refused
        assert all("ok" in a for a in good), good
        base = daemon.running.base
        assert get(f"{base}/v2")[0] == 401 and get(f"{base}/v2", token=TOKEN)[0] == 200
        assert get(f"{base}/v2/health/ready")[0] == 200  # health stays open for probes
        # Each answered v2 call, on either port, is one `rpc` log event like rknn.v1's.
        log = daemon.running.daemon.log_text().splitlines()
        events = [json.loads(line) for line in log if line.startswith("{")]
        v2 = [(e["method"], e["outcome"]) for e in events if str(e.get("method", "")).startswith("v2.")]
        assert v2.count(("v2.ModelInfer", "OK")) == 1 and v2.count(("v2.rest.ModelInfer", "OK")) == 1, v2
        assert ("v2.rest.ModelMetadata", "OK") in v2 and ("v2.rest.ServerMetadata", "OK") in v2, v2
    finally:
        daemon.running.daemon.stop()


def serve_briefly(tmp_path: Path, repository: Path, by_env: bool = False) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "rknn_server", "--runtime", "host", "--listen", "tcp://127.0.0.1:0"]
    args += ["--model-cache", str(tmp_path / "cache")]
    env = clean_environ()
    if by_env:
        env["RKNN_SERVER_MODEL_REPOSITORY"] = str(repository)
    else:
        args += ["--model-repository", str(repository)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, env=env)


def test_a_bad_model_folder_stops_the_start(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / "resnet").mkdir(parents=True)
    (repository / "resnet" / "model.onnx").write_bytes(b"x")
    (repository / "resnet" / "config.toml").write_text('[[inputs]]\nname = "x"\ndims = [1]\n')
    done = serve_briefly(tmp_path, repository)
    assert done.returncode == 2
    assert "model 'resnet': config.toml: [[inputs]] 0 has unknown key(s) ['dims']" in done.stderr

    (repository / "resnet" / "config.toml").unlink()
    (repository / "resnet" / "weights.bin").symlink_to("/etc/passwd")
    done = serve_briefly(tmp_path, repository, by_env=True)
    assert done.returncode == 2 and "'weights.bin' is a symbolic link" in done.stderr

    done = serve_briefly(tmp_path, tmp_path / "missing")
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_sessions_are_cached_per_caller_bounded_and_closed_on_unload(
    tmp_path: Path, triton_python: Path
) -> None:
    # Two sessions at most: v2 keeps one per caller and model, evicting the least recently used.
    daemon = start_v2_daemon(tmp_path, triton_python, "--max-sessions", "2")
    try:
        pair = {"a": np.ones((1, 4), np.float32), "b": np.ones((1, 4), np.float32)}
        for model, arrays in [
            ("cnn", {"input": IMAGE}),
            ("spare", pair),
            ("nhwc", {"input": IMAGE.transpose(0, 2, 3, 1)}),
        ] * 2:
            daemon.infer(model, "grpc", arrays)
        with connect(daemon.running.daemon.url) as device:
            assert device.info(refresh=True).open_sessions == 1
            # The rknn.v1 path still gets its session beside the cached one.
            with device.load(tmp_path / "repository" / "cnn" / "model.onnx") as session:
                session.run([IMAGE])
            assert daemon.one({"op": "unload", "model": "nhwc"}) == {"ok": True}
            assert device.info(refresh=True).open_sessions == 0
    finally:
        daemon.running.daemon.stop()


def test_an_rknn_model_on_the_rknnrt_runtime(tmp_path: Path, triton_python: Path, stub_lib: Path) -> None:
    """A repository .rknn on librknnrt (the stub): uint8 NHWC in, the int8 output dequantized as rknn.v1 does."""
    repository = tmp_path / "repository"
    (repository / "score").mkdir(parents=True)
    image_model(repository / "score" / "image.rknn")
    board = rk3588_board(tmp_path / "board")
    running = start_metrics_daemon(
        tmp_path, "--model-repository", str(repository), *rknnrt_args(stub_lib, board)
    )
    daemon = V2Daemon(running, triton_python, tmp_path)
    try:
        meta = daemon.one({"op": "metadata", "model": "score", "protocol": "http-json"})["ok"]
        assert meta["platform"] == "rknn"
        assert [(t["datatype"], t["shape"]) for t in meta["inputs"]] == [("UINT8", [1, 16, 16, 3])]
        assert [t["datatype"] for t in meta["outputs"]] == ["FP32"]
        image = np.random.default_rng(4).integers(0, 255, (1, 16, 16, 3), dtype=np.uint8)
        with (
            connect(running.daemon.url) as device,
            device.load(repository / "score" / "image.rknn") as session,
        ):
            expected = session.run([image])[0]
        for protocol in ("grpc", "http-binary"):
            found = daemon.infer("score", protocol, {"image": image})["score"]
            assert found.dtype == expected.dtype == np.float32 and found.tobytes() == expected.tobytes()
    finally:
        running.daemon.stop()


def test_one_callers_concurrent_requests_run_in_a_pool_of_sessions(tmp_path: Path) -> None:
    """With one ONNX Runtime thread a session, as many runs as cores compute at once: a caller's
    concurrent v2 requests get sessions of the model for those and as many waiting at the runtime's
    gate (not one they all queue on), and no more."""
    parallel = concurrent_runs(1)
    if parallel < 2:
        pytest.skip("one CPU core: one run at a time, so a pool of one")
    (tmp_path / "repository" / "big").mkdir(parents=True)
    small_cnn(tmp_path / "repository" / "big" / "model.onnx", size=128)
    running = start_metrics_daemon(
        tmp_path, "--model-repository", str(tmp_path / "repository"), "--threads", "1"
    )
    image = np.zeros((1, 3, 128, 128), np.float32)
    request = pb.ModelInferRequest(
        model_name="big",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=image.shape)],
        raw_input_contents=[image.tobytes()],
    )
    try:
        with grpc.insecure_channel(running.daemon.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelInfer(request, timeout=60)
            with ThreadPoolExecutor(4 * parallel) as pool:
                replies = list(pool.map(lambda _: stub.ModelInfer(request, timeout=60), range(40 * parallel)))
        assert all(len(r.raw_output_contents[0]) == 40 for r in replies)
        with connect(running.daemon.url) as device:
            assert 2 <= device.info(refresh=True).open_sessions <= 2 * parallel
    finally:
        running.daemon.stop()


def test_a_repository_model_evicted_from_the_cache_is_brought_in_again(
    tmp_path: Path, triton_python: Path
) -> None:
    """A request that finds no live session of a repository model whose bytes left the cache (its
    session reaped, then the model evicted) loads it again from its folder and is answered."""
    daemon = start_v2_daemon(tmp_path, triton_python, "--session-idle-timeout", "0.3")
    try:
        first = daemon.infer("cnn", "grpc", {"input": IMAGE})
        with connect(daemon.running.daemon.url) as device:
            deadline = time.monotonic() + 30
            while device.info(refresh=True).open_sessions and time.monotonic() < deadline:
                time.sleep(0.1)
            assert device.info(refresh=True).open_sessions == 0  # reaped: nothing pins the model
        models = tmp_path / "cache" / "models"
        cnn = (tmp_path / "repository" / "cnn" / "model.onnx").read_bytes()
        (evicted,) = [
            d
            for d in models.iterdir()
            if (d / "model.onnx").is_file() and (d / "model.onnx").read_bytes() == cnn
        ]
        shutil.rmtree(evicted)
        again = daemon.infer("cnn", "grpc", {"input": IMAGE})
        assert first.keys() == again.keys() and all(np.array_equal(first[k], again[k]) for k in first)
        assert (evicted / "model.onnx").is_file()  # in the cache again, under the same digest
        log = daemon.running.daemon.log_text().splitlines()
        loads = [
            e
            for e in (json.loads(line) for line in log if line.startswith("{"))
            if e.get("event") == "model_loaded"
        ]
        assert [e["model"] for e in loads].count("cnn") == 2
    finally:
        daemon.running.daemon.stop()
