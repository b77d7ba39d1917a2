"""A start that fails half way undoes what it had started (daemon.serve's exit stack): in-process, so
that the threads, ports and files it leaves behind can be seen."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest

from rknn_server.cli import daemon_config, serve_parser
from rknn_server.daemon import serve


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _can_bind(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_start_failing_at_its_last_door_stops_the_doors_and_threads_it_had_started(tmp_path: Path) -> None:
    """The toolkit's listener starts after the gRPC server, the doorbells and the HTTP endpoint: a
    taken port there must leave none of those serving, and no ready file."""
    name = f"rknn-test-taken-{tmp_path.name}"
    taken = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    taken.bind("\0" + name)
    taken.listen()
    grpc_port, http_port = _free_port(), _free_port()
    args = serve_parser().parse_args(
        [
            "--runtime", "host", "--model-cache", str(tmp_path / "cache"),
            "--listen", f"tcp://127.0.0.1:{grpc_port}",
            "--metrics-listen", f"tcp://127.0.0.1:{http_port}",
            "--legacy-listen", f"unix-abstract:{name}",
            "--ready-file", str(tmp_path / "ready.json"),
        ]
    )  # fmt: skip
    before = set(threading.enumerate())
    try:
        with pytest.raises(OSError):
            asyncio.run(serve(daemon_config(args)))
    finally:
        taken.close()
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not [name for name in left if name.startswith(("doorbell", "runtime"))], left
    assert _can_bind(grpc_port), "the gRPC port is still held"
    assert _can_bind(http_port), "the HTTP port is still held"
    assert not (tmp_path / "ready.json").exists()
