"""Where the legacy listener answers: local sockets only, the ones a board's adbd forwards to.

The toolkit reaches `local:transfer_proxy` through `adb forward`; adbd resolves that to the socket
`/dev/socket/transfer_proxy` (Android-style adbd) or to the abstract `@transfer_proxy`. The legacy
protocol has no authentication, so it never listens on TCP. Each connection is admitted by the
door's gate under its user (SO_PEERCRED: adbd's user for adb callers) before a byte is read; one
beyond the caps is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog

from rknn_server.core.data_plane import DataPlane
from rknn_server.kit.connections import Gate, Refused, unix_peer_identity
from rknn_server.observe.calls import Recorder
from rknn_server.protocols.legacy.connection import Door, LegacyConnection, LegacyLimits
from rknn_server.protocols.legacy.intake import ModelIntake
from rknn_server.protocols.legacy.layouts import Layout

log = structlog.get_logger("rknn_server.legacy")
DEFAULT_PLACES = ("unix:/dev/socket/transfer_proxy", "unix-abstract:transfer_proxy")


@dataclass(frozen=True)
class LegacyPlace:
    """A unix socket path (`unix:/PATH`) or an abstract name (`unix-abstract:NAME`)."""

    path: str = ""
    abstract: str = ""

    def display(self) -> str:
        return f"unix:{self.path}" if self.path else f"unix-abstract:{self.abstract}"

    def address(self) -> str:
        return self.path or "\0" + self.abstract


def parse_place(text: str) -> LegacyPlace:
    if text.startswith("unix-abstract:"):
        name = text.removeprefix("unix-abstract:")
        if not name or "/" in name:
            raise ValueError(
                f"legacy listen place {text!r}: expected unix-abstract:NAME with a non-empty NAME"
            )
        return LegacyPlace(abstract=name)
    if text.startswith("unix:"):
        path = text.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"legacy listen place {text!r}: expected unix:/ABSOLUTE/PATH")
        return LegacyPlace(path=path)
    raise ValueError(
        f"legacy listen place {text!r}: expected unix:/PATH or unix-abstract:NAME (the toolkit's protocol has "
        "no authentication, so it is served on local sockets only, never TCP)"
    )


def _clear_stale_socket(path: Path) -> None:
    """A socket file left by a previous daemon is replaced; any other file is left alone (and binding fails)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()


class LegacyListener:
    def __init__(self, plane: DataPlane, limits: LegacyLimits, layout: Layout) -> None:
        self.gate = Gate("toolkit", limits.connections, "--toolkit-idle-timeout")
        intake = ModelIntake(plane, limits.max_model_bytes)
        self.door = Door(plane, layout, limits, self.gate, intake, Recorder(plane.metrics))
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.Task[None]] = set()

    async def listen(self, place: LegacyPlace) -> None:
        if place.path:
            path = Path(place.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            _clear_stale_socket(path)
        server = await asyncio.start_unix_server(
            lambda r, w: self._accept(r, w, place.display()), place.address(), limit=1 << 20
        )
        if place.path:
            os.chmod(place.path, 0o600)
        self._servers.append(server)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer, name))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        """Serve one connection while the gate counts it in; one it has no room for is closed at once."""
        identity = unix_peer_identity(writer.get_extra_info("socket"))
        try:
            with self.gate.admit(identity):
                await LegacyConnection(self.door, reader, writer, name, identity).serve()
        except Refused as exc:
            log.info("legacy_connection_refused", place=name, client=identity, reason=str(exc))
            writer.transport.abort()

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
