"""Count the Python calls one `RKNN.inference` makes, from the client down to the backend's `run` and
back, with the daemon served on this process's main thread (its real `serve`, a real loopback port).

    .venv/bin/python -m bench.call_count [--runs 20]

Every thread is profiled (`sys.setprofile`/`threading.setprofile`), but only while an inference is being
measured; the calls inside the backend's own `run` (ONNX Runtime's Python wrapper) are not the path and
are counted apart. The figures are per inference, averaged over `--runs` after two warm-up runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

RUN_FILE = os.path.join("runtime", "host.py")


class CallCounter:
    """Python function calls per side while `on`; calls nested in the backend's `run` kept apart."""

    def __init__(self, client_thread: int) -> None:
        self.on = False
        self.client_thread = client_thread
        self.counts: Counter[str] = Counter()
        self.modules: Counter[str] = Counter()  # path calls by package (rknn_*, grpc, structlog, ...)
        self.functions: Counter[str] = Counter()  # path calls by side, file and function
        self._inside: dict[int, int] = {}  # thread -> depth inside the backend's run

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "return"):
            return
        thread = threading.get_ident()
        code = frame.f_code
        is_run = code.co_name == "run" and code.co_filename.endswith(RUN_FILE)
        depth = self._inside.get(thread, 0)
        if event == "return":
            if is_run and depth:
                self._inside[thread] = depth - 1
            return
        if depth:
            self.counts["inside the backend's run"] += 1
        else:
            side = "client" if thread == self.client_thread else "daemon"
            self.counts[side] += 1
            self.modules[_package(code.co_filename)] += 1
            self.functions[f"{side} {Path(code.co_filename).name}:{code.co_name}"] += 1
        if is_run:
            self._inside[thread] = depth + 1


def _package(filename: str) -> str:
    parts = Path(filename).parts
    for name in ("rknn_client", "rknn_server", "rknn_proto", "client", "server", "proto"):
        if name in parts:
            return {"client": "rknn_client", "server": "rknn_server", "proto": "rknn_proto"}.get(name, name)
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return "stdlib" if "lib" in parts else Path(filename).name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client(url: str, model: Path, runs: int, top: int, counter: CallCounter, result: dict[str, Any]) -> None:
    from rknn_client import connect
    from rknn_client.compat.rknn import RKNN

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with connect(url) as device:
                    device.info()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        rknn = RKNN()
        rknn.config(mean_values=[[0, 0, 0]], std_values=[[1, 1, 1]])
        assert rknn.load_onnx(str(model)) == 0
        assert rknn.init_runtime(device_id=url) == 0
        image = np.zeros((16, 16, 3), np.uint8)
        for _ in range(2):
            rknn.inference(inputs=[image])
        counter.client_thread = threading.get_ident()
        counter.on = True
        for _ in range(runs):
            outputs = rknn.inference(inputs=[image])
        counter.on = False
        assert outputs is not None
        rknn.release()
        result["counts"] = {k: v / runs for k, v in counter.counts.items()}
        result["modules"] = {k: v / runs for k, v in counter.modules.most_common(8)}
        result["functions"] = {k: v / runs for k, v in counter.functions.most_common(top)}
    except BaseException as exc:
        result["error"] = exc
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=0, help="also list the N functions called most")
    args = parser.parse_args()
    os.environ["RKNN_CLIENT_TOOLKIT"] = "host"

    from rknn_server.config.daemon_config import DaemonConfig
    from rknn_server.config.listen import parse_listen
    from rknn_server.daemon import serve
    from rknn_server.observe.logs import configure
    from tests import models

    configure("json", "error")
    with tempfile.TemporaryDirectory(prefix="rknn-call-count-") as tmp:
        folder = Path(tmp)
        model = models.small_cnn(folder / "small_cnn.onnx")
        port = free_port()
        counter = CallCounter(0)
        result: dict[str, Any] = {}
        threading.setprofile(counter)
        worker = threading.Thread(
            target=client,
            args=(f"tcp://127.0.0.1:{port}", model, args.runs, args.top, counter, result),
            daemon=True,
        )
        worker.start()
        sys.setprofile(counter)
        config = DaemonConfig(
            listen=[parse_listen(f"tcp://127.0.0.1:{port}")], runtime="host", model_cache=folder / "cache"
        )
        asyncio.run(serve(config))
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        worker.join(10)
    if "error" in result:
        raise result["error"]
    counts = result["counts"]
    path = counts.get("client", 0) + counts.get("daemon", 0)
    print(f"Python calls per RKNN.inference, excluding the backend's run (average of {args.runs}):")
    for name in ("client", "daemon", "inside the backend's run"):
        print(f"  {name:26s} {counts.get(name, 0):8.1f}")
    print(f"  {'path total':26s} {path:8.1f}")
    print("of which, by package:")
    for name, count in result["modules"].items():
        print(f"  {name:26s} {count:8.1f}")
    if args.top:
        print(f"the {args.top} functions called most:")
        for name, count in result["functions"].items():
            print(f"  {name:60s} {count:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
