"""What Python gRPC itself costs here, with a server that does nothing: the ceiling any daemon
built on it can reach, measured in the same run as the daemon's figures.

- a client stream of 512 MiB in 1 MiB messages to a no-op grpc.aio server (uvloop), vs a raw socket;
- one unary call carrying a MobileNetV2-size input (602,112 bytes), and the same bytes as a stream.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import time
from typing import Any

import grpc

from bench.raw_socket import transfer_seconds

STREAM_BYTES = 512 << 20
STREAM_CHUNK = 1 << 20
CALL_BYTES = 3 * 224 * 224 * 4
CALLS = 300


async def _drain(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
    async for _ in requests:
        pass
    return b""


async def _echo_small(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"\0" * 4000


async def _serve(port: Any) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    handlers = {
        "Drain": grpc.stream_unary_rpc_method_handler(_drain),
        "Call": grpc.unary_unary_rpc_method_handler(_echo_small),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ceiling.NoOp", handlers),))
    port.value = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await server.wait_for_termination()


def _server_main(port: Any) -> None:
    try:
        import uvloop

        uvloop.run(_serve(port))
    except ImportError:
        asyncio.run(_serve(port))


def measure_ceiling(streams: bool = True) -> dict[str, Any]:
    """The figures above; with streams=False the unary call's alone (bench.percall)."""
    ctx = multiprocessing.get_context("spawn")
    port = ctx.Value("i", 0)
    server = ctx.Process(target=_server_main, args=(port,), daemon=True)
    server.start()
    try:
        while not port.value:
            time.sleep(0.05)
        block = os.urandom(STREAM_CHUNK)
        with grpc.insecure_channel(
            f"127.0.0.1:{port.value}", options=[("grpc.max_send_message_length", 64 << 20)]
        ) as ch:
            drain = ch.stream_unary("/ceiling.NoOp/Drain")
            call = ch.unary_unary("/ceiling.NoOp/Call")
            stream_s = []
            for _ in range(3 if streams else 0):
                start = time.perf_counter()
                drain(iter([block] * (STREAM_BYTES // STREAM_CHUNK)))
                stream_s.append(time.perf_counter() - start)
            payload = os.urandom(CALL_BYTES)
            for _ in range(20):
                call(payload)
            calls = []
            for _ in range(CALLS):
                start = time.perf_counter()
                call(payload)
                calls.append(time.perf_counter() - start)
        raw = min(transfer_seconds(os.urandom(STREAM_BYTES), echo=False) for _ in range(3)) if streams else 0
    finally:
        server.kill()
        server.join()
    call = {"no_op_unary_call_with_602112_bytes_p50_ms": statistics.median(calls) * 1e3}
    if not streams:
        return call
    best = min(stream_s)
    return {
        "no_op_stream_mb_s": STREAM_BYTES / best / 1e6,
        "raw_socket_mb_s": STREAM_BYTES / raw / 1e6,
        "no_op_stream_vs_raw_socket": raw / best,
        **call,
        "meaning": "no server built on Python gRPC can beat these on this machine",
    }
