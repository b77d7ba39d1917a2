"""Fixtures for the reliability tests: real daemon subprocesses on free loopback ports, stopped by PID."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest

from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import FileEntry, manifest_digest
from rknn_server.testing import DaemonProcess, start_daemon
from tests.models import save_graph, small_cnn
from tests.reliability.stall_backend import use_stall_backend

TOKEN = "alice-token-0123456789abcdef"
OTHER_TOKEN = "bob-token-0123456789abcdefgh"
StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture(autouse=True)
def _importable_tests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Daemons and their workers import the test backend from this tree."""
    use_stall_backend(monkeypatch, tmp_path)
    for name in ("RKNN_SERVER", "RKNN_SERVER_TOKEN", "RKNN_SERVER_TLS_CA", "RKNN_SERVER_TLS_CERT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[StartDaemon]:
    """Start daemons (stopped by PID at the end); `cache` defaults to one folder per test."""
    started: list[DaemonProcess] = []

    def start(
        *args: str, cache: Path | None = None, listen_tcp: bool = True, cwd: Path | None = None
    ) -> DaemonProcess:
        log = tmp_path / f"daemon-{len(started)}.log"
        daemon = start_daemon(cache or tmp_path / "cache", log, ["--runtime", "host", *args], listen_tcp, cwd)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"# test tokens\nalice:{TOKEN}\nbob:{OTHER_TOKEN}\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_cnn(tmp_path_factory.mktemp("models") / "cnn.onnx")


def cnn_input(value: float = 0.5) -> np.ndarray:
    return np.full((1, 3, 16, 16), value, np.float32)


def device(daemon: DaemonProcess, **kwargs: object) -> Device:
    return Device(tcp_endpoint(daemon.url), **kwargs)  # type: ignore[arg-type]


def info(daemon: DaemonProcess, token: str | None = None) -> rknn_pb2.GetInfoResponse:
    """GetInfo over a fresh raw channel."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(daemon.address) as channel:
        reply: rknn_pb2.GetInfoResponse = rknn_pb2_grpc.RknnServerStub(channel).GetInfo(
            rknn_pb2.GetInfoRequest(), metadata=metadata, timeout=30
        )
        return reply


def events(daemon: DaemonProcess, name: str) -> list[dict[str, object]]:
    """The daemon's JSON log events called `name`."""
    found = []
    for line in daemon.log_path.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


def rpcs(daemon: DaemonProcess, method: str) -> int:
    """How many calls of `method` the daemon has logged."""
    return sum(1 for e in events(daemon, "rpc") if e["method"] == method)


def weighty_model(path: Path, megabytes: int, seed: int = 1) -> Path:
    """An ONNX MatMul whose weight makes the file about `megabytes` MiB: uploads of several chunks."""
    from onnx import TensorProto, helper, numpy_helper

    cols = megabytes * 1024 * 1024 // (4 * 64)
    w = np.random.default_rng(seed).standard_normal((64, cols)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "weighty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])],
        [numpy_helper.from_array(w, "w")],
    )
    return save_graph(graph, path)


def python_child(code: str, args: Sequence[str] = ()) -> subprocess.Popen[str]:
    """A client in a process of its own (so that it can be SIGKILLed), stdout piped for its signals."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_line(child: subprocess.Popen[str], prefix: str) -> str:
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"the child exited ({child.wait()}) before printing {prefix!r}")


def kill(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()
    if child.stdout is not None:
        child.stdout.close()


def wire_manifest(files: Sequence[tuple[str, bytes]]) -> rknn_pb2.ModelManifest:
    """The manifest of a model made of these (name, bytes), main file first, digest consistent."""
    entries = [FileEntry(name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files]
    return rknn_pb2.ModelManifest(
        digest=manifest_digest(entries),
        files=[rknn_pb2.ModelFile(name=e.name, size=e.size, sha256=e.sha256) for e in entries],
    )


def raw_upload(
    address: str,
    manifest: rknn_pb2.ModelManifest,
    chunks: Iterable[tuple[int, int, bytes]] = (),
    offsets: Sequence[int] | None = None,
) -> tuple[grpc.StatusCode, str]:
    """One UploadModel call as a hostile or careless client makes it: this header, these
    (file index, offset, bytes) chunks, then the end of the stream. Returns the status and details."""

    def requests() -> Iterator[rknn_pb2.UploadModelRequest]:
        start = list(offsets) if offsets is not None else [0] * len(manifest.files)
        yield rknn_pb2.UploadModelRequest(
            header=rknn_pb2.UploadHeader(manifest=manifest, start_offsets=start)
        )
        for index, offset, data in chunks:
            yield rknn_pb2.UploadModelRequest(
                chunk=rknn_pb2.UploadChunk(file_index=index, offset=offset, data=data)
            )

    with grpc.insecure_channel(address) as channel:
        try:
            rknn_pb2_grpc.RknnServerStub(channel).UploadModel(requests(), timeout=120)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at `mount` (needs root); the test is skipped where it cannot be mounted."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
