"""Count the Python calls one `RKNN.inference` makes, from the client down to the backend's `run` and
back, with the daemon served on this process's main thread (its real `serve`, a real loopback port);
with `--door v2`, one KServe v2 ModelInfer of the same model from its repository folder (raw tensor
bytes, as tritonclient sends them); with `--door toolkit`, one run of the RKNN-Toolkit2 protocol
(MsgMultiInput then MsgRun, as the real toolkit sends them, on the daemon's toolkit listener) instead.

    .venv/bin/python -m bench.call_count [--runs 20] [--door v2|toolkit]

Every thread is profiled (`sys.setprofile`/`threading.setprofile`), but only while an inference is being
measured; the calls inside the backend's own `run` (ONNX Runtime's Python wrapper) are not the path and
are counted apart. The figures are per inference, averaged over `--runs` after two warm-up runs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

# The backend's own run, by door: ONNX Runtime's wrapper, or the C stand-in for librknnrt behind ctypes.
RUN_FILES = {
    "rknn.v1": os.path.join("runtime", "host_model.py"),
    "v2": os.path.join("runtime", "host_model.py"),
    "toolkit": os.path.join("rknnrt", "model.py"),
}


class CallCounter:
    """Python function calls per side while `on`; calls nested in the backend's `run` kept apart."""

    def __init__(self, client_thread: int, run_file: str) -> None:
        self.on = False
        self.run_file = run_file
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
        is_run = code.co_name == "run" and code.co_filename.endswith(self.run_file)
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


def measure(
    counter: CallCounter, runs: int, top: int, result: dict[str, Any], steps: Sequence[Callable[[], Any]]
) -> Any:
    """One run's `steps` (callables the counter does not see themselves: bound methods, partials),
    `runs` times with the counter on (on this thread: the client's); the counts per run go into
    `result`; returns the last step's last answer."""
    counter.client_thread = threading.get_ident()
    counter.on = True
    for _ in range(runs):
        for step in steps:
            answer = step()
    counter.on = False
    result["counts"] = {k: v / runs for k, v in counter.counts.items()}
    result["modules"] = {k: v / runs for k, v in counter.modules.most_common(8)}
    result["functions"] = {k: v / runs for k, v in counter.functions.most_common(top)}
    return answer


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
        outputs = measure(counter, runs, top, result, [functools.partial(rknn.inference, inputs=[image])])
        assert outputs is not None
        rknn.release()
    except BaseException as exc:
        result["error"] = exc
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def v2_client(
    address: str, model: Path, runs: int, top: int, counter: CallCounter, result: dict[str, Any]
) -> None:
    """One KServe v2 ModelInfer of a repository model, as tritonclient sends it (raw tensor bytes)."""
    import grpc

    from rknn_proto.kserve import grpc_service_pb2 as pb
    from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc

    try:
        image = np.zeros((1, 3, 16, 16), np.float32)
        request = pb.ModelInferRequest(
            model_name=model.parent.name,
            inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=image.shape)],
            raw_input_contents=[image.tobytes()],
        )
        with grpc.insecure_channel(address.removeprefix("tcp://")) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            deadline = time.monotonic() + 60
            while True:
                try:
                    if stub.ModelReady(pb.ModelReadyRequest(name=request.model_name), timeout=5).ready:
                        break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.1)
            for _ in range(2):
                stub.ModelInfer(request, timeout=30)
            reply = measure(
                counter, runs, top, result, [functools.partial(stub.ModelInfer, request, timeout=30)]
            )
            assert len(reply.raw_output_contents[0]) == 40
    except BaseException as exc:
        result["error"] = exc
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def toolkit_model(folder: Path) -> Path:
    """A .rknn the stand-in runs: one 1x16x16x3 NHWC float input, like the CNN's image."""
    from tests.rknnrt.stub_build import StubTensor, write_stub_model

    return write_stub_model(
        folder / "model.rknn",
        inputs=[StubTensor("image", "FP32", "NHWC", (1, 16, 16, 3))],
        outputs=[StubTensor("score", "FP32", "NHWC", (1, 16, 16, 3))],
    )


def toolkit_client(
    address: str, model: Path, runs: int, top: int, counter: CallCounter, result: dict[str, Any]
) -> None:
    """The toolkit's requests of one run, written by the tests' wire client (no toolkit code runs here)."""
    from tests.legacy.wire_client import FINISH, WireClient

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                wire = WireClient(address)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert wire.open() == 0
        loaded = wire.load(model.read_bytes())
        assert loaded.ack == 0, loaded.text()
        image = np.zeros((1, 16, 16, 3), np.float32)  # NHWC, as the toolkit sends 4-D inputs
        for _ in range(2):
            wire.set_inputs([image])
            assert wire.run().command == FINISH
        reply = measure(counter, runs, top, result, [functools.partial(wire.set_inputs, [image]), wire.run])
        result_code = struct.unpack_from("<I", reply.data, 0x74)[0]  # MsgFinish: frame id, then the result
        assert reply.command == FINISH and result_code == 0, reply.text()
        wire.sock.close()
    except BaseException as exc:
        result["error"] = exc
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=0, help="also list the N functions called most")
    parser.add_argument(
        "--door",
        choices=("rknn.v1", "v2", "toolkit"),
        default="rknn.v1",
        help="RKNN.inference, a KServe v2 ModelInfer of a repository model, or a toolkit run",
    )
    args = parser.parse_args()
    os.environ["RKNN_CLIENT_TOOLKIT"] = "host"

    from rknn_server.config.daemon_config import DaemonConfig
    from rknn_server.config.listen import parse_listen
    from rknn_server.daemon import serve
    from rknn_server.observe.logs import configure
    from tests import models
    from tests.rknnrt.fake_sysfs import rk3588_board
    from tests.rknnrt.stub_build import build_stub

    configure("json", "warning" if args.door == "toolkit" else "error")
    with tempfile.TemporaryDirectory(prefix="rknn-call-count-") as tmp:
        folder = Path(tmp)
        port = free_port()
        counter = CallCounter(0, RUN_FILES[args.door])
        result: dict[str, Any] = {}
        threading.setprofile(counter)
        legacy = f"rknn-call-count-{os.getpid()}"
        if args.door == "toolkit":  # the toolkit loads .rknn models: librknnrt's stand-in runs them
            model = toolkit_model(folder)
            target, address = toolkit_client, "\0" + legacy
            runtime = {
                "runtime": "rknnrt",
                "runtime_lib": build_stub(folder / "stub"),
                "sysfs_root": rk3588_board(folder / "board"),
                "legacy_listen": (f"unix-abstract:{legacy}",),
            }
        elif args.door == "v2":
            (folder / "repository" / "cnn").mkdir(parents=True)
            model = models.small_cnn(folder / "repository" / "cnn" / "model.onnx")
            target, address = v2_client, f"tcp://127.0.0.1:{port}"
            runtime = {"runtime": "host", "legacy_listen": (), "model_repository": folder / "repository"}
        else:
            model = models.small_cnn(folder / "small_cnn.onnx")
            target, address = client, f"tcp://127.0.0.1:{port}"
            runtime = {"runtime": "host", "legacy_listen": ()}
        worker = threading.Thread(
            target=target, args=(address, model, args.runs, args.top, counter, result), daemon=True
        )
        worker.start()
        sys.setprofile(counter)
        config = DaemonConfig(
            listen=[parse_listen(f"tcp://127.0.0.1:{port}")], model_cache=folder / "cache", **runtime
        )
        asyncio.run(serve(config))
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        worker.join(10)
    if "error" in result:
        raise result["error"]
    counts = result["counts"]
    path = counts.get("client", 0) + counts.get("daemon", 0)
    what = {"toolkit": "toolkit-protocol run", "v2": "v2 ModelInfer"}.get(args.door, "RKNN.inference")
    print(f"Python calls per {what}, excluding the backend's run (average of {args.runs}):")
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
