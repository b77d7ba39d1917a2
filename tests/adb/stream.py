"""One adb stream on the device side: flow control (one WRTE in flight each way) and byte relaying."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from tests.adb.wire import CLSE, OKAY, WRTE, Message


class Stream:
    """A device-side stream; the connection feeds it, a service task consumes it.

    The connection's read loop only queues payloads here: the service acknowledges each one (`ack`)
    after its local write completed, so one slow stream never stalls the others.
    """

    def __init__(
        self,
        local_id: int,
        remote_id: int,
        max_payload: int,
        send_message: Callable[[Message], None],
        forget: Callable[[int], None],
    ) -> None:
        self.local_id = local_id
        self.remote_id = remote_id
        self._max_payload = max_payload
        self._send_message = send_message
        self._forget = forget
        self._inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._may_write = asyncio.Event()
        self._may_write.set()
        self.closed = False

    async def send(self, data: bytes) -> None:
        """Send bytes to the host, waiting for its OKAY before each further WRTE."""
        for start in range(0, len(data), self._max_payload):
            await self._may_write.wait()
            if self.closed:
                raise ConnectionResetError("adb stream closed by the host")
            self._may_write.clear()
            chunk = data[start : start + self._max_payload]
            self._send_message(Message(WRTE, self.local_id, self.remote_id, chunk))

    async def recv(self) -> bytes | None:
        """The next payload from the host, or None once the host closed the stream."""
        return await self._inbound.get()

    def ack(self) -> None:
        """Tell the host the last payload was consumed, so it may send the next one."""
        if not self.closed:
            self._send_message(Message(OKAY, self.local_id, self.remote_id))

    def close(self) -> None:
        """Close from the device side (the host answers CLSE, which is then ignored)."""
        if not self.closed:
            self._send_message(Message(CLSE, self.local_id, self.remote_id))
            self._shut()

    def on_host_write(self, data: bytes) -> None:
        self._inbound.put_nowait(data)

    def on_host_okay(self) -> None:
        self._may_write.set()

    def on_host_close(self) -> None:
        """The host closed the stream: answer CLSE and wake everything waiting on it."""
        self.close()

    def _shut(self) -> None:
        self.closed = True
        self._forget(self.local_id)
        self._inbound.put_nowait(None)
        self._may_write.set()


class StreamBytes:
    """Exact-size reads over a stream's payloads, for framed services such as sync:."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def read_exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            chunk = await self._stream.recv()
            if chunk is None:
                raise EOFError("adb stream closed mid-frame")
            self._buffer += chunk
            self._stream.ack()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


async def relay(stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy bytes both ways between a stream and a local socket or pipe until either side ends."""

    async def host_to_local() -> None:
        while (data := await stream.recv()) is not None:
            writer.write(data)
            await writer.drain()
            stream.ack()

    async def local_to_host() -> None:
        while data := await reader.read(1 << 20):
            await stream.send(data)

    tasks = [asyncio.ensure_future(host_to_local()), asyncio.ensure_future(local_to_host())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await task
        stream.close()
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
