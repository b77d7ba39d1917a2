"""The baseline every transfer is compared with: the same bytes over a plain loopback TCP socket."""

from __future__ import annotations

import socket
import threading
import time

_BLOCK = 1 << 20


def _serve(listener: socket.socket, echo: bool) -> None:
    conn, _ = listener.accept()
    with conn:
        header = conn.recv(8, socket.MSG_WAITALL)
        remaining = int.from_bytes(header, "little")
        buf = bytearray(_BLOCK)
        while remaining:
            n = conn.recv_into(buf, min(_BLOCK, remaining))
            if not n:
                return
            remaining -= n
            if echo:
                conn.sendall(memoryview(buf)[:n])
        conn.sendall(b"k")


def transfer_seconds(payload: bytes | memoryview, echo: bool) -> float:
    """Seconds to send `payload` to a loopback peer (and, with echo, receive it back)."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = threading.Thread(target=_serve, args=(listener, echo), daemon=True)
    server.start()
    view = memoryview(payload).cast("B")
    start = time.perf_counter()
    with socket.create_connection(listener.getsockname()) as conn:
        conn.sendall(len(view).to_bytes(8, "little"))
        if echo:
            reader = threading.Thread(target=_drain, args=(conn, len(view)), daemon=True)
            reader.start()
            conn.sendall(view)
            reader.join()
        else:
            conn.sendall(view)
        conn.recv(1, socket.MSG_WAITALL) if not echo else None
    elapsed = time.perf_counter() - start
    server.join()
    listener.close()
    return elapsed


def _drain(conn: socket.socket, total: int) -> None:
    buf = bytearray(_BLOCK)
    remaining = total + 1
    while remaining:
        n = conn.recv_into(buf, min(_BLOCK, remaining))
        if not n:
            return
        remaining -= n
