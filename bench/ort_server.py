"""The floor of a remote frame over gRPC: ONNX Runtime behind the smallest gRPC server that can run it.

No daemon code: a process of its own (uvloop, the daemon's HTTP/2 options) holds the model in an
InferenceSession with the daemon's options, and one unary method takes the input's raw bytes, runs
the model in an executor thread (as any asyncio server must, to keep serving) and answers the first
output's raw bytes. Its p50 against in-process ONNX Runtime, alternated, is what the daemon's own
per-call overhead is compared with: what is left above it is the daemon's code; what is below it,
Python gRPC, asyncio and a second process sharing the cores.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort

from bench.grpc_ceiling import GRPC_OPTIONS
from bench.side_by_side import side_by_side
from rknn_server.runtime.host import default_threads
from rknn_server.runtime.host_model import session_options


def _session(model: Path) -> tuple[ort.InferenceSession, str]:
    session = ort.InferenceSession(
        str(model), session_options(default_threads()), providers=["CPUExecutionProvider"]
    )
    return session, session.get_inputs()[0].name


async def _serve(model: Path, shape: tuple[int, ...], port: Any) -> None:
    session, name = _session(model)
    loop = asyncio.get_running_loop()

    async def run(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        x = np.frombuffer(request, np.float32).reshape(shape)
        outputs = await loop.run_in_executor(None, session.run, None, {name: x})
        return bytes(np.ascontiguousarray(outputs[0]).data)

    server = grpc.aio.server(options=GRPC_OPTIONS)
    handlers = {"Run": grpc.unary_unary_rpc_method_handler(run)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Ort", handlers),))
    port.value = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await server.wait_for_termination()


def _server_main(model: Path, shape: tuple[int, ...], port: Any) -> None:
    try:
        import uvloop

        uvloop.run(_serve(model, shape, port))
    except ImportError:
        asyncio.run(_serve(model, shape, port))


def measure(model: Path, x: np.ndarray, runs: int, warm: int = 20) -> tuple[float, float]:
    """(in-process p50, behind-the-minimal-server p50) in seconds, alternated."""
    ctx = multiprocessing.get_context("spawn")
    port = ctx.Value("i", 0)
    process = ctx.Process(target=_server_main, args=(model, x.shape, port), daemon=True)
    process.start()
    try:
        while not port.value:
            if not process.is_alive():
                raise RuntimeError("the ONNX Runtime gRPC floor server did not start")
            time.sleep(0.05)
        local, name = _session(model)
        payload = bytes(np.ascontiguousarray(x).data)
        with grpc.insecure_channel(f"127.0.0.1:{port.value}", options=GRPC_OPTIONS) as channel:
            call = channel.unary_unary("/floor.Ort/Run")
            return side_by_side(
                lambda: local.run(None, {name: x}), lambda: call(payload, timeout=60), runs, warm
            )
    finally:
        process.terminate()
        process.join(30)
