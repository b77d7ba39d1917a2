"""What every peer's server script shares (imported inside the peer's venv, so standard library,
NumPy and ONNX Runtime only): the job it is given, ONNX Runtime sessions made exactly as our
daemon makes them, the threads that run them, and the line that says it serves."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

READY_LINE = "peer ready"
READY_TIMEOUT_S = 120.0
# As many runs at once as our daemon allows with --threads 1 on this machine (one per core).
RUN_THREADS = 2


@dataclass(frozen=True)
class Served:
    name: str
    file: Path


@dataclass(frozen=True)
class Job:
    models: list[Served]
    grpc_port: int
    http_port: int
    metrics_port: int

    @classmethod
    def from_argv(cls) -> Job:
        """The job is one JSON argument (peers parse their own flags from argv at import)."""
        spec = json.loads(sys.argv[1])
        models = [Served(m["name"], Path(m["file"])) for m in spec["models"]]
        return cls(models, spec["grpc_port"], spec["http_port"], spec["metrics_port"])


def session_options() -> ort.SessionOptions:
    """rknn_server.runtime.host_model.session_options(1), which this venv cannot import: one
    intra-op and one inter-op thread, no spinning, a memory arena (ours has one for models whose
    shapes are all static, as every bench model is)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.enable_cpu_mem_arena = True
    return opts


class OrtModel:
    """One model: its session and the single input and output the bench models have."""

    def __init__(self, file: Path) -> None:
        self.session = ort.InferenceSession(str(file), session_options(), providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run([self.output], {self.input: x})[0])


def run_pool() -> ThreadPoolExecutor:
    """Where a peer's asyncio handler runs ONNX Runtime, so its loop keeps serving meanwhile."""
    return ThreadPoolExecutor(RUN_THREADS, thread_name_prefix="ort")


def announce_when_ready(job: Job) -> None:
    """Print READY_LINE once every model answers ready over REST and gRPC's port accepts; a thread,
    since each peer's serve call blocks."""

    def ready(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def poll() -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        urls = [f"http://127.0.0.1:{job.http_port}/v2/models/{m.name}/ready" for m in job.models]
        while time.monotonic() < deadline:
            if all(ready(url) for url in urls) and _accepts(job.grpc_port):
                print(READY_LINE, flush=True)
                return
            time.sleep(0.2)

    threading.Thread(target=poll, daemon=True).start()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False
