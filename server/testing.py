"""Start `rknn_server` as a real subprocess on a free loopback port, and stop it by PID.

Shipped with the daemon (like structlog's `structlog.testing`) so the demo, the benchmarks, the
project's tests and a user's own tests all run the daemon the way a user does: the real process, its
`listening on` line (parsed by `rknn_proto.ready`) as the sign that it serves. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rknn_proto.ready import wait_tcp_address

START_TIMEOUT_S = 60.0


@dataclass
class DaemonProcess:
    process: subprocess.Popen[str]
    address: str  # "127.0.0.1:PORT"
    log_path: Path

    @property
    def url(self) -> str:
        return f"tcp://{self.address}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return int(self.process.returncode)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def clean_environ() -> dict[str, str]:
    """This process's environment without the daemon's RKNN_SERVER_* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RKNN_SERVER_")}


def start_daemon(
    cache_dir: Path,
    log_path: Path,
    extra_args: Sequence[str] = (),
    listen_tcp: bool = True,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> DaemonProcess:
    """`env` adds RKNN_SERVER_* settings; those of the calling environment are not passed on, so a
    developer's shell cannot change what a test or benchmark runs."""
    cmd = [
        sys.executable,
        "-m",
        "rknn_server",
        "--model-cache",
        str(cache_dir),
        "--log-format",
        "json",
        *extra_args,
    ]
    if listen_tcp:
        cmd += ["--listen", "tcp://127.0.0.1:0"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**clean_environ(), **(env or {}), "PYTHONUNBUFFERED": "1"},
        cwd=cwd,
    )
    log.close()
    assert process.stdout is not None
    address = wait_tcp_address(process.stdout, START_TIMEOUT_S)
    if address is None:
        process.kill()
        process.wait()
        raise RuntimeError(f"rknn_server did not start: {log_path.read_text()[-3000:]}")
    return DaemonProcess(process, address, log_path)
