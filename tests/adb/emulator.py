"""A device-side adbd emulator: what the real adb binary reaches with `adb connect 127.0.0.1:PORT`.

No AUTH (an unsecured device). Run in-process (`EmulatorThread`) or as a subprocess:
`python -m tests.adb.emulator --port 0 --serial-name NAME --root DIR` prints
`listening on tcp://127.0.0.1:PORT` and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from rknn_proto.ready import listening_line
from tests.adb.services import DeviceProfile, open_service
from tests.adb.stream import Stream
from tests.adb.wire import CLSE, CNXN, MAX_PAYLOAD, OKAY, OPEN, VERSION, WRTE, Message, encode, read_message


class Connection:
    """One host transport: the handshake, then dispatching messages to streams."""

    def __init__(
        self, emulator: Emulator, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._emulator = emulator
        self._reader = reader
        self._writer = writer
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count(1)
        self._max_payload = MAX_PAYLOAD
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        try:
            while True:
                message = await read_message(self._reader)
                if not self._emulator.muted:
                    self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self.drop()

    def drop(self) -> None:
        """Hang up: the host sees the transport vanish."""
        for task in self._tasks:
            task.cancel()
        for stream in list(self._streams.values()):
            stream.on_host_close()
        self._writer.close()

    def send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode(message))

    def _dispatch(self, message: Message) -> None:
        if message.command == CNXN:
            self._max_payload = min(MAX_PAYLOAD, message.arg1)
            version = min(VERSION, message.arg0)
            self.send(Message(CNXN, version, MAX_PAYLOAD, self._emulator.profile.banner()))
        elif message.command == OPEN:
            self._spawn(self._open(message.arg0, message.data.rstrip(b"\0").decode()))
        elif stream := self._streams.get(message.arg1):
            if message.command == WRTE:
                stream.on_host_write(message.data)
            elif message.command == OKAY:
                stream.on_host_okay()
            elif message.command == CLSE:
                stream.on_host_close()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open(self, remote_id: int, service: str) -> None:
        handler = await open_service(service, self._emulator.profile)
        if handler is None:
            self.send(Message(CLSE, 0, remote_id))
            return
        stream = Stream(next(self._ids), remote_id, self._max_payload, self.send, self._forget)
        self._streams[stream.local_id] = stream
        self.send(Message(OKAY, stream.local_id, remote_id))
        try:
            await handler(stream)
        finally:
            stream.close()

    def _forget(self, local_id: int) -> None:
        self._streams.pop(local_id, None)


class Emulator:
    """The listening adbd. `muted` makes it ignore everything (the host sees a silent device)."""

    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        self.muted = False
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and hang up every host: the device is gone."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.drop()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)


class EmulatorThread:
    """An emulator on its own event loop in a daemon thread, for in-process tests."""

    def __init__(self, profile: DeviceProfile) -> None:
        self.emulator = Emulator(profile)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="adbd-emulator", daemon=True)
        self.port = 0

    def start(self) -> int:
        self._thread.start()
        self.port = self._call(self.emulator.start())
        return self.port

    def mute(self) -> None:
        """Keep the socket but answer nothing (adb then reports the device offline)."""
        self.emulator.muted = True

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self.emulator.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--serial-name", default="emulated")
    parser.add_argument("--model", default="Emulated RK3588 board")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the fake device root")
    parser.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    props = dict(item.split("=", 1) for item in args.prop)
    profile = DeviceProfile(args.root, serial_name=args.serial_name, model=args.model, props=props)

    async def serve() -> None:
        emulator = Emulator(profile)
        port = await emulator.start(port=args.port)
        print(listening_line(f"tcp://127.0.0.1:{port}"), flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
