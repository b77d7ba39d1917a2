"""The simulator case: no target and no device, so the client starts a private host-runtime daemon
on a free loopback port, as the toolkit runs its simulator without any set-up, and stops it at close.

The daemon is a separate program (`python -m rknn_server`), not an import: the client package stays
independent of the server package. It exits by itself when this process dies (its stdin closes).
It accepts only a random token made for this client (as Jupyter does), so other users of this machine
cannot use it: the token reaches it in a 0600 file inside a private 0700 folder, never on its command
line (which every local user can read), and the folder is removed as soon as the daemon listens.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from rknn_client.transport.base import Endpoint, TransportError
from rknn_proto.ready import wait_tcp_address

START_TIMEOUT_S = 60.0


def private_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rknn_client" / "private-daemon"


def _token_file(folder: Path, token: str) -> Path:
    """Write the token where only this user can read it (the folder is 0700, the file 0600)."""
    path = folder / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(f"private-client:{token}\n")
    return path


def start_private_daemon(soc: str = "") -> Endpoint:
    """Start `rknn_server --runtime host` on 127.0.0.1:0, for this client's token only; return its endpoint."""
    token = secrets.token_urlsafe(32)
    folder = Path(tempfile.mkdtemp(prefix="rknn-private-"))
    try:
        return _start(soc, token, _token_file(folder, token))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _start(soc: str, token: str, token_file: Path) -> Endpoint:
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
        "--auth-token-file",
        str(token_file),
    ]
    if soc:
        cmd += ["--soc", soc]
    try:
        # The caller's RKNN_SERVER_* variables are its client settings (token, TLS files) or a board
        # daemon's; the daemon would read them as its own (RKNN_SERVER_TLS_CERT turning TLS on).
        env = {k: v for k, v in os.environ.items() if not k.startswith("RKNN_SERVER_")}
        process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    except OSError as exc:
        raise TransportError(f"cannot start the private host-runtime daemon: {exc}") from exc
    assert process.stdout is not None
    address = wait_tcp_address(process.stdout, START_TIMEOUT_S)
    if address is None:
        process.kill()
        _, err = process.communicate(timeout=10)
        hint = ""
        if "No module named rknn_server" in err or "onnxruntime" in err.lower():
            hint = (
                " Install the host runtime into this Python with the project's host extra: "
                "pip install '.[host]' in a clone, or pip install 'rknn_server_oss-VERSION-py3-none-any.whl[host]' "
                "from a wheel (make wheel builds one)."
            )
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
        grpc_target=address,
        description=f"private host-runtime daemon (pid {process.pid}) on tcp://{address}",
        kind="private",
        close=_once(stop),
        token=token,
    )


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = threading.Event()

    def wrapper() -> None:
        if not done.is_set():
            done.set()
            fn()

    return wrapper
