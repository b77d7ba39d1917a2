"""What Python gRPC itself costs here, with a server that does nothing: the ceiling any daemon
built on it can reach, measured in the same run as the daemon's figures.

- a client stream of 512 MiB in 1 MiB messages to a no-op grpc.aio server (uvloop), vs a raw socket;
- one unary call carrying a MobileNetV2-size input (602,112 bytes), and the same bytes as a stream;
- a shared-memory frame's floors (measure_doorbell): a no-op unary call of a few hundred bytes, and
  one such message answered on an open bidirectional stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import statistics
import time
from collections.abc import Iterator
from typing import Any

import grpc

from bench.raw_socket import transfer_seconds

STREAM_BYTES = 512 << 20
STREAM_CHUNK = 1 << 20
CALL_BYTES = 3 * 224 * 224 * 4
CALLS = 300
# A shared-memory frame's request (a header naming slots) and reply (output metas): a few hundred bytes.
DOORBELL_BYTES = 300
DOORBELL_REPLY_BYTES = 120


async def _drain(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
    async for _ in requests:
        pass
    return b""


async def _echo_small(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"\0" * 4000


async def _doorbell_unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request[:DOORBELL_REPLY_BYTES]


async def _doorbell(requests: Any, context: grpc.aio.ServicerContext) -> Any:
    async for request in requests:
        yield request[:DOORBELL_REPLY_BYTES]


async def _serve(port: Any) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    handlers = {
        "Drain": grpc.stream_unary_rpc_method_handler(_drain),
        "Call": grpc.unary_unary_rpc_method_handler(_echo_small),
        "Echo": grpc.unary_unary_rpc_method_handler(_doorbell_unary),
        "Doorbell": grpc.stream_stream_rpc_method_handler(_doorbell),
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


@contextlib.contextmanager
def _no_op_server() -> Iterator[int]:
    """A no-op grpc.aio server (uvloop where installed) in a process of its own; yields its port."""
    ctx = multiprocessing.get_context("spawn")
    port = ctx.Value("i", 0)
    server = ctx.Process(target=_server_main, args=(port,), daemon=True)
    server.start()
    try:
        while not port.value:
            time.sleep(0.05)
        yield port.value
    finally:
        server.kill()
        server.join()


def measure_doorbell(calls: int = CALLS, rounds: int = 3) -> dict[str, Any]:
    """The per-frame floors of a shared-memory frame: p50 of a no-op unary call, and of one message
    answered on an open bidirectional stream, each carrying DOORBELL_BYTES (alternated, per round)."""
    payload = b"\1" * DOORBELL_BYTES
    unary_p50: list[float] = []
    stream_p50: list[float] = []
    with _no_op_server() as port, grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary("/ceiling.NoOp/Echo")
        bell: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        answers = ch.stream_stream("/ceiling.NoOp/Doorbell")(iter(bell.get, None))

        def ring() -> None:
            bell.put(payload)
            next(answers)

        for _ in range(rounds):
            for fn, into in ((lambda: call(payload), unary_p50), (ring, stream_p50)):
                for _ in range(20):
                    fn()
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - start)
                into.append(statistics.median(times) * 1e3)
        bell.put(None)
    return {
        f"no_op_unary_call_{DOORBELL_BYTES}_bytes_p50_ms": unary_p50,
        f"no_op_stream_message_{DOORBELL_BYTES}_bytes_p50_ms": stream_p50,
    }


def measure_ceiling() -> dict[str, Any]:
    with _no_op_server() as port:
        block = os.urandom(STREAM_CHUNK)
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        ) as ch:
            drain = ch.stream_unary("/ceiling.NoOp/Drain")
            call = ch.unary_unary("/ceiling.NoOp/Call")
            streams = []
            for _ in range(3):
                start = time.perf_counter()
                drain(iter([block] * (STREAM_BYTES // STREAM_CHUNK)))
                streams.append(time.perf_counter() - start)
            payload = os.urandom(CALL_BYTES)
            for _ in range(20):
                call(payload)
            calls = []
            for _ in range(CALLS):
                start = time.perf_counter()
                call(payload)
                calls.append(time.perf_counter() - start)
        raw = min(transfer_seconds(os.urandom(STREAM_BYTES), echo=False) for _ in range(3))
    best = min(streams)
    return {
        "no_op_stream_mb_s": STREAM_BYTES / best / 1e6,
        "raw_socket_mb_s": STREAM_BYTES / raw / 1e6,
        "no_op_stream_vs_raw_socket": raw / best,
        "no_op_unary_call_with_602112_bytes_p50_ms": statistics.median(calls) * 1e3,
        "meaning": "no server built on Python gRPC can beat these on this machine",
    }
