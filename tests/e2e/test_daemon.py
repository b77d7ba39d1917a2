"""The daemon as a process: leases, worker isolation, health, reflection, shutdown, the CLIs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rknn_client import FrameSpec, connect
from rknn_client.errors import SessionLost
from rknn_proto import rknn_pb2
from rknn_server.testing import DaemonProcess
from tests.conftest import DaemonFactory


def test_an_idle_session_is_freed_after_its_lease(make_daemon: DaemonFactory, cnn_model: Path) -> None:
    daemon = make_daemon("--session-idle-timeout", "1")
    with connect(daemon.url) as device:
        session = device.load(cnn_model)
        assert device.info(refresh=True).open_sessions == 1
        assert 0 < session.keep_alive() <= 1
        deadline = time.monotonic() + 15
        while device.info(refresh=True).open_sessions and time.monotonic() < deadline:
            time.sleep(0.2)
        assert device.info(refresh=True).open_sessions == 0
        with pytest.raises(SessionLost, match="expired"):
            session.run([np.zeros((1, 3, 16, 16), dtype=np.float32)])


def test_calls_renew_the_lease(make_daemon: DaemonFactory, cnn_model: Path) -> None:
    daemon = make_daemon("--session-idle-timeout", "2")
    with connect(daemon.url) as device, device.load(cnn_model) as session:
        for _ in range(8):
            time.sleep(0.5)
            session.run([np.zeros((1, 3, 16, 16), dtype=np.float32)])
        assert device.info(refresh=True).open_sessions == 1


def test_process_isolation_runs_each_session_in_a_worker(make_daemon: DaemonFactory, cnn_model: Path) -> None:
    daemon = make_daemon("--isolation", "process")
    parent = psutil.Process(daemon.pid)
    with connect(daemon.url) as device:
        session = device.load(cnn_model, perf_debug=True)
        workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 1
        out = session.run([np.ones((1, 3, 16, 16), dtype=np.float32)])
        assert out[0].shape == (1, 10)
        assert session.perf().layers and session.memory().weight_memory > 0
        session.release()
        workers[0].wait(timeout=10)
        assert not workers[0].is_running()


def test_health_and_reflection_answer(host_daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(host_daemon.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rknn.v1.RknnServer")
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answer = next(
            stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        )
        names = {s.name for s in answer.list_services_response.service}
    assert {"rknn.v1.RknnServer", "grpc.health.v1.Health"} <= names


def test_health_command_exit_codes(host_daemon: DaemonProcess, tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "rknn_server", "health", host_daemon.url], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "SERVING" in ok.stdout
    down = subprocess.run(
        [
            sys.executable,
            "-m",
            "rknn_server",
            "health",
            "unix-abstract:rknn-test-nobody-listens",
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert down.returncode == 1 and "not answering" in down.stderr


def test_bad_listen_address_is_refused_at_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rknn_server", "--listen", "http://0.0.0.0:1"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "tcp://HOST:PORT or unix-abstract:NAME" in result.stderr


def test_one_log_event_per_rpc(
    make_daemon: DaemonFactory, cnn_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "off")  # the wire's Run and its bytes (shared memory moves none)
    daemon = make_daemon()
    with connect(daemon.url) as device, device.load(cnn_model) as session:
        session.run([np.zeros((1, 3, 16, 16), dtype=np.float32)])
    import json

    # A call's line is written just after its reply leaves (calls.Recorder): the last call's (Release)
    # is in the log once the daemon has stopped.
    assert daemon.stop() == 0
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    rpcs = [e for e in events if e.get("event") == "rpc"]
    inference = next(e for e in rpcs if e["method"] == "Run")
    assert inference["outcome"] == "OK" and inference["bytes_in"] == 3 * 16 * 16 * 4
    assert inference["bytes_out"] == 40 and inference["session"] and inference["duration_ms"] > 0
    assert inference["frames"] == 1 and next(e for e in rpcs if e["method"] == "GetInfo")["frames"] is None
    assert {e["method"] for e in rpcs} >= {
        "GetInfo",
        "PrepareUpload",
        "UploadModel",
        "InitRuntime",
        "Release",
    }


def test_outputs_of_unknown_size_take_the_unary_run(make_daemon: DaemonFactory, tmp_path: Path) -> None:
    """A model with a dynamic output dimension no longer falls to the slower stream (issue #16: 6.4 ms
    vs 4.1 ms): its frames go by Run, and the Inference stream still answers the same."""
    import json

    from tests import models

    daemon = make_daemon()
    model = models.identity_of(tmp_path / "dynamic.onnx", "float32", ("n", 4))  # type: ignore[arg-type]
    x = np.arange(4 * 65536, dtype=np.float32).reshape(-1, 4)  # 1 MiB each way
    with connect(daemon.url) as device, device.load(model) as session:
        assert session.outputs[0].is_dynamic
        for rows in (2, len(x)):
            np.testing.assert_array_equal(session.run([x[:rows]])[0], x[:rows])
        requests = (rknn_pb2.InferenceRequest.FromString(m) for m in session.frame_bytes(FrameSpec([x])))
        streamed = list(session.device._stub.Inference(requests, metadata=device.metadata))
        assert streamed[0].header.outputs[0].shape == list(x.shape)
    daemon.stop()  # every call's log event written
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    runs = [(e["method"], e["bytes_out"]) for e in events if e.get("method") in ("Run", "Inference")]
    assert runs == [("Run", 32), ("Run", x.nbytes), ("Inference", x.nbytes)], runs
