"""What Python gRPC itself costs here, with a server that does nothing: the ceiling any daemon
built on it can reach, measured in the same run as the daemon's figures.

The no-op server runs in a process of its own (uvloop, as the daemon), with the daemon's HTTP/2
options on both sides, and answers three methods:
- Drain: a client stream of raw byte messages, dropped (an upload's ceiling);
- Bounce: a bidirectional stream whose messages are all sent back once the last has arrived (a
  round trip's ceiling: a model's outputs follow its whole inputs);
- Call: one unary call (a MobileNetV2-size input in, a small reply out);
- Echo and Answer: a shared-memory frame's floors (`measure_frame_calls`): a no-op unary call of a few
  hundred bytes, and one such message answered on an open bidirectional stream.
`measure_ceiling` gives the general figures; `NoOpServer` lets a benchmark measure its ceiling
alternately with the daemon, side by side.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

import grpc

from bench.raw_socket import transfer_seconds
from rknn_proto.version import HTTP2_OPTIONS, MAX_MESSAGE_BYTES

STREAM_BYTES = 512 << 20
STREAM_CHUNK = 1 << 20
CALL_BYTES = 3 * 224 * 224 * 4
CALLS = 300
# A shared-memory frame's request (a header naming slots) and reply (output metas): a few hundred bytes.
FRAME_BYTES = 300
FRAME_REPLY_BYTES = 120
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    *HTTP2_OPTIONS,
]


async def _drain(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    async for _ in requests:
        pass
    return b""


async def _bounce(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    received = [message async for message in requests]
    for message in received:
        yield message


async def _echo_small(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"\0" * 4000


async def _echo_frame(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request[:FRAME_REPLY_BYTES]


async def _answer_each(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
    async for request in requests:
        yield request[:FRAME_REPLY_BYTES]


async def _serve(port: Any) -> None:
    server = grpc.aio.server(options=GRPC_OPTIONS)
    handlers = {
        "Drain": grpc.stream_unary_rpc_method_handler(_drain),
        "Bounce": grpc.stream_stream_rpc_method_handler(_bounce),
        "Call": grpc.unary_unary_rpc_method_handler(_echo_small),
        "Echo": grpc.unary_unary_rpc_method_handler(_echo_frame),
        "Answer": grpc.stream_stream_rpc_method_handler(_answer_each),
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


def _messages(nbytes: int, chunk: int) -> Iterator[bytes]:
    """`nbytes` in messages of `chunk` bytes (one block, sent again and again: nothing to read)."""
    block = os.urandom(chunk)
    for _ in range(nbytes // chunk):
        yield block
    if nbytes % chunk:
        yield block[: nbytes % chunk]


class NoOpServer:
    """The no-op server in a process of its own and a channel to it, for `with`."""

    def __enter__(self) -> NoOpServer:
        ctx = multiprocessing.get_context("spawn")
        port = ctx.Value("i", 0)
        self._process = ctx.Process(target=_server_main, args=(port,), daemon=True)
        self._process.start()
        while not port.value:
            if not self._process.is_alive():
                raise RuntimeError("the no-op gRPC server did not start")
            time.sleep(0.05)
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port.value}", options=GRPC_OPTIONS)
        self.drain = self._channel.stream_unary("/ceiling.NoOp/Drain")
        self.bounce = self._channel.stream_stream("/ceiling.NoOp/Bounce")
        self.call = self._channel.unary_unary("/ceiling.NoOp/Call")
        self.echo = self._channel.unary_unary("/ceiling.NoOp/Echo")
        self.answer = self._channel.stream_stream("/ceiling.NoOp/Answer")
        self.stream_seconds(8 * STREAM_CHUNK, STREAM_CHUNK)  # connected and warm
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._channel.close()
        self._process.kill()
        self._process.join()

    @property
    def pid(self) -> int:
        """The server's process (for its CPU time)."""
        return int(self._process.pid or 0)

    def stream_seconds(self, nbytes: int, chunk: int) -> float:
        """Seconds to stream `nbytes` to the server in `chunk`-byte messages."""
        start = time.perf_counter()
        self.drain(_messages(nbytes, chunk))
        return time.perf_counter() - start

    def bounce_seconds(self, nbytes: int, chunk: int) -> float:
        """Seconds to send `nbytes` in `chunk`-byte messages and receive them all back once the last
        has arrived (as a model's outputs follow its whole inputs)."""
        start = time.perf_counter()
        received = sum(len(m) for m in self.bounce(_messages(nbytes, chunk)))
        elapsed = time.perf_counter() - start
        assert received == nbytes, (received, nbytes)
        return elapsed


def measure_frame_calls(calls: int = CALLS, rounds: int = 3) -> dict[str, Any]:
    """The per-frame floors of a shared-memory frame: p50 of a no-op unary call, and of one message
    answered on an open bidirectional stream, each carrying FRAME_BYTES (alternated, per round)."""
    payload = b"\1" * FRAME_BYTES
    unary_p50: list[float] = []
    stream_p50: list[float] = []
    with NoOpServer() as server:
        asked: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        answers = server.answer(iter(asked.get, None))

        def message() -> None:
            asked.put(payload)
            next(answers)

        for _ in range(rounds):
            for fn, into in ((lambda: server.echo(payload), unary_p50), (message, stream_p50)):
                for _ in range(20):
                    fn()
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - start)
                into.append(statistics.median(times) * 1e3)
        asked.put(None)
    return {
        f"no_op_unary_call_{FRAME_BYTES}_bytes_p50_ms": unary_p50,
        f"no_op_stream_message_{FRAME_BYTES}_bytes_p50_ms": stream_p50,
    }


def measure_ceiling(streams: bool = True) -> dict[str, Any]:
    """The figures above; with streams=False the unary call's alone (bench.percall)."""
    with NoOpServer() as server:
        stream_s = [server.stream_seconds(STREAM_BYTES, STREAM_CHUNK) for _ in range(3 if streams else 0)]
        payload = os.urandom(CALL_BYTES)
        for _ in range(20):
            server.call(payload)
        calls = []
        for _ in range(CALLS):
            start = time.perf_counter()
            server.call(payload)
            calls.append(time.perf_counter() - start)
    call = {"no_op_unary_call_with_602112_bytes_p50_ms": statistics.median(calls) * 1e3}
    if not streams:
        return call
    raw = min(transfer_seconds(os.urandom(STREAM_BYTES), echo=False) for _ in range(3))
    best = min(stream_s)
    return {
        "no_op_stream_mb_s": STREAM_BYTES / best / 1e6,
        "raw_socket_mb_s": STREAM_BYTES / raw / 1e6,
        "no_op_stream_vs_raw_socket": raw / best,
        **call,
        "meaning": "no server built on Python gRPC can beat these on this machine",
    }
