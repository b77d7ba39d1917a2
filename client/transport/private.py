"""The simulator case: no target and no device, so the client starts a private host-runtime daemon
on a free loopback port, as the toolkit runs its simulator without any set-up, and stops it at close.

The daemon is a separate program (`python -m rknn_server`), not an import: the client package stays
independent of the server package. It exits by itself when this process dies (its stdin closes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rknn_client.transport.base import Endpoint, TransportError

START_TIMEOUT_S = 60.0


def private_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rknn_client" / "private-daemon"


def _read_address(process: subprocess.Popen[str], found: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("listening on tcp://"):
            found.append(line.split("listening on tcp://", 1)[1].strip())
            break


def start_private_daemon(soc: str = "") -> Endpoint:
    """Start `rknn_server --runtime host` on 127.0.0.1:0 and return its endpoint."""
    cmd = [
        sys.executable,
        "-m",
        "rknn_server",
        "--listen",
        "tcp://127.0.0.1:0",
        "--runtime",
        "host",
        "--model-cache",
        str(private_cache_dir()),
        "--log-format",
        "json",
        "--log-level",
        "warning",
        "--exit-with-stdin",
    ]
    if soc:
        cmd += ["--soc", soc]
    try:
        process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as exc:
        raise TransportError(f"cannot start the private host-runtime daemon: {exc}") from exc
    found: list[str] = []
    reader = threading.Thread(target=_read_address, args=(process, found), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    if not found:
        process.kill()
        _, err = process.communicate(timeout=10)
        hint = ""
        if "No module named rknn_server" in err or "onnxruntime" in err.lower():
            hint = " Install the host runtime with: pip install 'rknn-server-oss[host]'."
        raise TransportError(f"the private host-runtime daemon did not start: {err.strip()[-2000:]}.{hint}")

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()

    return Endpoint(
        grpc_target=found[0],
        description=f"private host-runtime daemon (pid {process.pid}) on tcp://{found[0]}",
        kind="private",
        close=_once(stop),
    )


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = threading.Event()

    def wrapper() -> None:
        if not done.is_set():
            done.set()
            fn()

    return wrapper
