"""`rknn-client` as a subprocess: run to its end (`cli`), or in the background with its stderr lines read
as they come (progress, windows), for tests that act mid-run (Ctrl-C, a daemon stopped)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable

EOF_MARK = "<eof>"
# The CLI as a terminal starts it, whatever this test run was started as: a shell's background job
# (and nohup) starts with SIGINT ignored, which its children inherit, and a SIGINT a test sends
# would then do nothing.
AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'rknn-client'; runpy.run_module('rknn_client.cli', run_name='__main__')"
)
DUMP_WAIT_S = 10.0


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`rknn-client ARGS` to its end, its output captured; `env` adds to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "rknn_client.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


class CliRun:
    """Each pipe has its one reader thread: communicate() would read stderr too, racing the line
    reader, and the last lines (a final error message) could be lost to it."""

    def __init__(self, args: Iterable[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", AS_FROM_A_TERMINAL, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A run that hangs is stopped with SIGABRT first: faulthandler then writes where each of
            # its threads was into the stderr that finish() reports.
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self._out: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=lambda: self._out.extend(self.process.stdout or ()), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stderr(self) -> None:
        for line in self.process.stderr or ():
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append(EOF_MARK)
            self.changed.notify_all()

    def wait_for(self, wanted: set[str], timeout: float = 120) -> None:
        """Until a stderr line starting with each of `wanted` arrived (fails if the run ended first)."""
        with self.changed:
            done = self.changed.wait_for(
                lambda: (
                    all(any(line.startswith(w) for line in self.lines) for w in wanted)
                    or EOF_MARK in self.lines
                ),
                timeout,
            )
        assert done and EOF_MARK not in self.lines, "".join(self.lines)[-3000:]

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) once it exits; if it does not in time, its threads' stacks
        are dumped (SIGABRT), it is killed and the test fails with its stderr's end."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=DUMP_WAIT_S)
            raise AssertionError(
                f"still running {timeout} s later; its stderr ends: {self._stderr_once_ended()[-6000:]}"
            ) from None
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        for reader in self._readers:
            reader.join(timeout)
        return self.process.returncode, "".join(self._out), "".join(self.lines)

    def _stderr_once_ended(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._readers[0].join(DUMP_WAIT_S)
        return "".join(self.lines)
