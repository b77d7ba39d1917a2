"""A recording relay between the emulated board's `local:transfer_proxy` and a server's socket.

It listens on a path socket (adbd's reserved namespace: `<board>/dev/socket/transfer_proxy`), opens
the server's socket for each client, and copies bytes both ways unchanged while it cuts them into
the protocol's units: the client's 48-byte open, the server's 4-byte status, then `u32 length` framed
messages in each direction. Each unit is one JSON line of the transcript (connection number,
direction, base64 bytes), in the order the relay saw them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from pathlib import Path

OPEN_BYTES = 48
STATUS_BYTES = 4
_LENGTH_BYTES = 4
_CHUNK = 1 << 20


def connect_to(address: str) -> socket.socket:
    """`@name` is an abstract unix socket, anything else a path."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + address[1:] if address.startswith("@") else address)
    return sock


class _Transcript:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a")
        self.lock = threading.Lock()

    def add(self, connection: int, direction: str, data: bytes) -> None:
        line = {"conn": connection, "dir": direction, "data": base64.b64encode(data).decode()}
        with self.lock:
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        piece = sock.recv(min(_CHUNK, count - len(data)))
        if not piece:
            return None
        data += piece
    return bytes(data)


def _pump(
    source: socket.socket, sink: socket.socket, first: int, record: _Transcript, conn: int, way: str
) -> None:
    """Copy `first` bytes (the open or the status) as one unit, then framed messages, until EOF."""
    try:
        unit = _read_exactly(source, first)
        while unit is not None:
            sink.sendall(unit)
            record.add(conn, way, unit)
            head = _read_exactly(source, _LENGTH_BYTES)
            if head is None:
                break
            body = _read_exactly(source, int.from_bytes(head, "little"))
            if body is None:
                break
            sink.sendall(head)
            unit = body
    except OSError:
        pass
    finally:
        for sock in (source, sink):  # one side gone: the other sees it as the peer would
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class RecordingRelay:
    """Serves `listen_path` until closed; every client is relayed to `upstream` and recorded."""

    def __init__(self, listen_path: Path, upstream: str, transcript: Path) -> None:
        listen_path.parent.mkdir(parents=True, exist_ok=True)
        listen_path.unlink(missing_ok=True)
        self.path = listen_path
        self.upstream = upstream
        self.record = _Transcript(transcript)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(listen_path))
        self.listener.listen(8)
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, name="relay", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                server = connect_to(self.upstream)
            except OSError:  # the server is not there: the client sees a hang-up, as from a board
                client.close()
                continue
            for source, sink, first, way in (
                (client, server, OPEN_BYTES, "c2s"),
                (server, client, STATUS_BYTES, "s2c"),
            ):
                threading.Thread(
                    target=_pump, args=(source, sink, first, self.record, self.connections, way), daemon=True
                ).start()

    def close(self) -> None:
        self.listener.close()
        self.path.unlink(missing_ok=True)
        self.record.close()
