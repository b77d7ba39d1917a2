"""Starting each server the bench compares, one at a time, on free loopback ports, and stopping
it (and whatever it started) by PID: our daemon (host runtime, one intra-op thread per session, its
v2 gRPC on the rknn.v1 port and v2 REST on the metrics listener) and each peer's server script."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.peers.models import BenchModel
from bench.peers.proctree import ProcessTree
from bench.peers.serving import READY_LINE
from bench.peers.venvs import Peer, PeerVenv
from rknn_proto.ready import read_ready_file
from rknn_server.testing import start_daemon

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PEER_START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0
# Our daemon as the peers run: host runtime, one ONNX Runtime intra-op thread per session.
DAEMON_ARGS = ("--runtime", "host", "--threads", "1", "--metrics-listen", "tcp://127.0.0.1:0")


class StartError(RuntimeError):
    """A server did not come up; the message says why (its log's tail)."""


@dataclass
class Running:
    name: str
    tree: ProcessTree
    doors: dict[str, str]  # protocol -> what its driver's job calls "url"
    start_s: float  # from spawning it until every model answered ready
    stop: Callable[[], object]


def free_port() -> int:
    """A port free on every address (KServe binds 0.0.0.0 and [::] whatever it is told)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def models_ready(http: str, models: list[BenchModel], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for model in models:
                with urllib.request.urlopen(f"http://{http}/v2/models/{model.name}/ready", timeout=5):
                    pass
            return True
        except OSError:
            time.sleep(0.05)
    return False


def repository(folder: Path, models: list[BenchModel]) -> Path:
    """A v2 model repository of the bench models for our daemon (a folder each, the file in it)."""
    for model in models:
        (folder / model.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model.file, folder / model.name / "model.onnx")
    return folder


def start_ours(work: Path, models: list[BenchModel], extra: tuple[str, ...] = ()) -> Running:
    ready = work / "ready.json"
    ready.unlink(missing_ok=True)
    started = time.perf_counter()
    daemon = start_daemon(
        work / "cache",
        work / "daemon.log",
        [
            *DAEMON_ARGS,
            "--model-repository",
            str(repository(work / "repository", models)),
            "--ready-file",
            str(ready),
            *extra,
        ],
    )
    http = read_ready_file(ready).metrics.removeprefix("http://").split("/", 1)[0]
    if not models_ready(http, models, 60):
        daemon.stop()
        raise StartError(f"our daemon's models never answered ready: {daemon.log_text()[-2000:]}")
    start_s = time.perf_counter() - started
    doors = {"rknn_v1": daemon.url, "v2_grpc": daemon.address, "v2_rest": http, "v2_rest_json": http}
    return Running("ours", ProcessTree(daemon.pid), doors, start_s, daemon.stop)


def start_peer(peer: Peer, venv: PeerVenv, work: Path, models: list[BenchModel]) -> Running:
    """The peer's server script in its venv, its working folder its own (MLServer and PyTriton write
    there), printing READY_LINE when its models answer ready."""
    work.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    spec = {
        "models": [{"name": m.name, "file": str(m.file)} for m in models],
        "grpc_port": grpc_port,
        "http_port": http_port,
        "metrics_port": metrics_port,
    }
    log_path = work / "server.log"
    started = time.perf_counter()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(venv.python), str(HERE / peer.server), json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    tree = ProcessTree(process.pid)
    if not _printed_ready(process, work / "server.stdout.log"):
        _stop_tree(tree)
        raise StartError(
            f"{peer.name} did not start: {' / '.join(log_path.read_text().strip().splitlines()[-4:])}"[:800]
        )
    start_s = time.perf_counter() - started
    http = f"127.0.0.1:{http_port}"
    doors = {"v2_grpc": f"127.0.0.1:{grpc_port}", "v2_rest": http, "v2_rest_json": http}
    return Running(peer.name, tree, doors, start_s, lambda: _stop_tree(tree))


def _printed_ready(process: subprocess.Popen[str], out: Path) -> bool:
    """Wait for READY_LINE; its stdout goes on being drained into `out` (a full pipe would stall it)."""
    ready = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        with out.open("w") as sink:
            for line in process.stdout:
                sink.write(line)
                if line.strip() == READY_LINE:
                    ready.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + PEER_START_TIMEOUT_S
    while not ready.wait(0.1):
        if process.poll() is not None or time.monotonic() > deadline:
            return False
    return True


def _stop_tree(tree: ProcessTree) -> None:
    """SIGTERM the server, then SIGKILL whatever of its tree (as it was just before) is left."""
    processes = tree.processes()
    if not processes:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        processes[0].send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=STOP_TIMEOUT_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=STOP_TIMEOUT_S)
