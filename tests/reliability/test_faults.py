"""Faults a lab throws at the daemon, each injected for real: clients and daemons SIGKILLed mid-transfer,
a daemon restarted under a client, a runtime call that hangs, a shutdown with calls in flight."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from rknn_client.compat.rknn import RKNN
from rknn_client.device import Device
from rknn_client.errors import FailedPrecondition, RuntimeFailure, SessionLost
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import manifest, rknn_pb2, rknn_pb2_grpc
from rknn_server.testing import DaemonProcess
from tests.reliability.conftest import (
    StartDaemon,
    cnn_input,
    device,
    info,
    kill,
    python_child,
    wait_line,
    weighty_model,
)
from tests.reliability.stall_backend import STALL_VALUE

STALL_BACKEND = ("--backend", "tests.reliability.stall_backend:factory")
# Hang guard for waits on the daemon: far above any expected duration, never a measurement.
PATIENCE_S = 90.0

UPLOAD_AND_STALL = """
import sys, time
from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint

def progress(done, total):
    if done >= 3 << 20:
        print("stalled", flush=True)
        time.sleep(3600)

Device(tcp_endpoint(sys.argv[1])).upload(sys.argv[2], progress)
"""


def _log_events(daemon: DaemonProcess) -> list[dict[str, object]]:
    events = []
    for line in daemon.log_text().splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


def _wait(predicate: object, what: str) -> float:
    """Poll until predicate() is true; returns the seconds it took (hang guard: PATIENCE_S)."""
    start = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - start > PATIENCE_S:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def _workers(daemon: DaemonProcess) -> list[psutil.Process]:
    """The daemon's session worker processes (not multiprocessing's resource tracker)."""
    return [c for c in psutil.Process(daemon.pid).children() if "spawn_main" in " ".join(c.cmdline())]


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _held(daemon: DaemonProcess, model: Path) -> tuple[bool, int]:
    with grpc.insecure_channel(daemon.address) as channel:
        reply = rknn_pb2_grpc.RknnServerStub(channel).PrepareUpload(
            rknn_pb2.PrepareUploadRequest(manifest=manifest.describe_files([model])), timeout=30
        )
    return reply.cached, sum(reply.held_bytes)


def _upload_cut_after_3_mib(daemon: DaemonProcess, model: Path) -> object:
    child = python_child(UPLOAD_AND_STALL, [daemon.url, str(model)])
    wait_line(child, "stalled")  # after the first chunks (one or more, whatever their size)
    return child


def _init_code(daemon: DaemonProcess, model: Path) -> grpc.StatusCode:
    digest = manifest.describe_files([model]).digest
    with grpc.insecure_channel(daemon.address) as channel:
        try:
            rknn_pb2_grpc.RknnServerStub(channel).InitRuntime(
                rknn_pb2.InitRuntimeRequest(model_digest=digest), timeout=60
            )
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_client_killed_mid_upload_resumes_and_never_uses_the_partial(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    daemon = daemons()
    model = weighty_model(tmp_path / "weighty.onnx", 8)
    total = model.stat().st_size
    child = _upload_cut_after_3_mib(daemon, model)
    kill(child)  # type: ignore[arg-type]
    _wait(
        lambda: any(e.get("method") == "UploadModel" for e in _log_events(daemon)),
        "the daemon to see the upload end",
    )
    cached, held = _held(daemon, model)
    assert not cached and 0 < held < total
    assert _init_code(daemon, model) == grpc.StatusCode.NOT_FOUND  # a partial upload is not a model
    with device(daemon) as dev:
        result = dev.upload(model)
        assert result.sent_bytes == total - held
        print(
            f"\n[fault] client SIGKILLed mid-upload: daemon held {held} of {total} bytes, resume sent {result.sent_bytes}"
        )
        with dev.load(model) as session:
            assert session.run([np.ones((1, 64), np.float32)])[0].shape[0] == 1


def test_client_killed_mid_inference_frees_its_sessions_within_the_idle_timeout(
    daemons: StartDaemon, cnn: Path
) -> None:
    # Long enough that the first session outlives the loading of the other two on a loaded machine
    # (each spawns a worker), short enough that the test does not wait long for the reaper.
    idle = 8.0
    daemon = daemons("--session-idle-timeout", str(idle), "--isolation", "process", *STALL_BACKEND)
    stall = Path(os.environ["RKNN_TEST_STALL_DIR"])
    code = f"""
import sys
import numpy as np
from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint
dev = Device(tcp_endpoint(sys.argv[1]))
sessions = [dev.load(sys.argv[2]) for _ in range(3)]
print("opened", flush=True)
sessions[0].run([np.full((1, 3, 16, 16), {STALL_VALUE}, np.float32)])
"""
    child = python_child(code, [daemon.url, str(cnn)])
    wait_line(child, "opened")
    _wait(lambda: (stall / "started").exists(), "the inference to start")
    workers = _workers(daemon)
    assert len(workers) == 3 and info(daemon).open_sessions == 3
    kill(child)  # type: ignore[arg-type]
    killed = time.monotonic()
    (stall / "release").touch()  # the runtime call now ends; nobody is left to read its answer
    _wait(lambda: info(daemon).open_sessions == 0, "the sessions to be freed")
    freed_s = time.monotonic() - killed
    _wait(
        lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers),
        "workers to exit",
    )
    print(
        f"\n[fault] client SIGKILLed mid-inference with 3 sessions: freed {freed_s:.2f}s after the kill (idle timeout {idle}s)"
    )
    assert any(e.get("reason") == "idle lease expired" for e in _log_events(daemon))


def test_daemon_killed_mid_upload_restarts_with_a_clean_cache(
    daemons: StartDaemon, cnn: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "shared-cache"
    first = daemons(cache=cache)
    with device(first) as dev:
        dev.upload(cnn)
    big = weighty_model(tmp_path / "weighty.onnx", 8)
    child = _upload_cut_after_3_mib(first, big)
    first.process.kill()
    first.process.wait()
    kill(child)  # type: ignore[arg-type]
    second = daemons(cache=cache)
    assert _held(second, cnn)[0], "the completed model survived the crash"
    assert _init_code(second, big) == grpc.StatusCode.NOT_FOUND
    assert sorted(p.name for p in (cache / "models").iterdir()) == [manifest.describe_files([cnn]).digest]
    assert not list((cache / "staging").iterdir())
    assert (cache.stat().st_mode & 0o777) == 0o700
    _, held = _held(second, big)
    with device(second) as dev:
        assert dev.upload(big).sent_bytes == big.stat().st_size - held
        with dev.load(cnn) as session:
            assert session.run([cnn_input()])[0].shape == (1, 10)


def test_a_model_damaged_on_disk_is_removed_not_loaded(
    daemons: StartDaemon, cnn: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    daemon = daemons(cache=cache)
    digest = manifest.describe_files([cnn]).digest
    with device(daemon) as dev:
        dev.load(cnn).release()
        stored = cache / "models" / digest / cnn.name
        data = bytearray(stored.read_bytes())
        data[-1] ^= 0xFF
        stored.write_bytes(bytes(data))
        assert _init_code(daemon, cnn) == grpc.StatusCode.DATA_LOSS
        assert not (cache / "models" / digest).exists()
        assert dev.upload(cnn).sent_bytes == cnn.stat().st_size


def test_daemon_restart_loses_sessions_clearly_and_reconnect_reopens_them(
    daemons: StartDaemon,
    cnn: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "cache"
    first = daemons(cache=cache)
    port = first.address.rsplit(":", 1)[1]
    plain, again = Device(tcp_endpoint(first.url)), Device(tcp_endpoint(first.url))
    strict = plain.load(cnn)
    notes: list[str] = []
    resilient = again.load(cnn, reconnect=True, on_reconnect=notes.append)
    compat, compat_off = RKNN(), RKNN()
    for r in (compat, compat_off):
        assert r.load_onnx(str(cnn)) == 0
        assert r.init_runtime(device_id=first.url) == 0
    before = [strict.run([cnn_input()])[0], resilient.run([cnn_input()])[0]]
    assert first.stop() == 0
    second = daemons("--listen", f"tcp://127.0.0.1:{port}", cache=cache, listen_tcp=False)
    for dev in (plain, again, compat._runtime.device, compat_off._runtime.device):
        assert dev is not None
        grpc.channel_ready_future(dev._channel).result(timeout=PATIENCE_S)
    with pytest.raises(SessionLost, match="daemon restarted, session lost"):
        strict.run([cnn_input()])
    np.testing.assert_allclose(resilient.run([cnn_input()])[0], before[1])
    assert notes and "0 bytes" in notes[0]
    capsys.readouterr()
    assert compat.inference([cnn_input()]) is not None
    assert "re-initialized" in capsys.readouterr().out
    monkeypatch.setenv("RKNN_CLIENT_AUTO_RECONNECT", "0")
    assert compat_off.inference([cnn_input()]) is None
    assert info(second).open_sessions == 2
    for r in (compat, compat_off):
        r.release()
    resilient.release()
    plain.close()
    again.close()


def test_a_hanging_call_kills_only_its_worker_and_breaks_only_its_session(
    daemons: StartDaemon, cnn: Path
) -> None:
    daemon = daemons("--isolation", "process", "--call-timeout", "3", *STALL_BACKEND)
    with device(daemon) as dev:
        hung, healthy = dev.load(cnn), dev.load(cnn)
        workers = _workers(daemon)
        with pytest.raises(RuntimeFailure, match="did not answer run within 3"):
            hung.run([cnn_input(STALL_VALUE)])
        with pytest.raises(FailedPrecondition, match="broken"):
            hung.run([cnn_input()])
        assert healthy.run([cnn_input()])[0].shape == (1, 10)
        assert len(workers) == 2 and len(_alive(workers)) == 1
        assert dev.info(refresh=True).limits["call_timeout_s"] == 3
        hung.release()
        healthy.release()
        assert info(daemon).open_sessions == 0


def test_sigterm_lets_the_call_in_flight_finish_and_exits_zero(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons("--grace", "60", *STALL_BACKEND)
    stall = Path(os.environ["RKNN_TEST_STALL_DIR"])
    with device(daemon) as dev:
        session = dev.load(cnn)
        outcome: list[object] = []
        call = threading.Thread(target=lambda: outcome.append(session.run([cnn_input(STALL_VALUE)])))
        call.start()
        _wait(lambda: (stall / "started").exists(), "the inference to start")
        daemon.process.send_signal(signal.SIGTERM)
        _wait(lambda: "daemon_stopping" in daemon.log_text(), "the daemon to start stopping")
        (stall / "release").touch()
        call.join(PATIENCE_S)
        assert outcome and isinstance(outcome[0], list) and outcome[0][0].shape == (1, 10)
        assert daemon.process.wait(PATIENCE_S) == 0
    released = [e for e in _log_events(daemon) if e.get("event") == "session_released"]
    assert [e["reason"] for e in released] == ["daemon shutting down"]
