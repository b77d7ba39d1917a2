"""The client side of the bridge: one long-lived worker process in the toolkit's interpreter per RKNN object.

Requests and replies are JSON lines on two private pipes (the worker's stdout/stderr stay free for the
toolkit's own printing, which is streamed to ours as it comes). Arrays travel as `.npy` files in a
private temp dir, loaded without pickle on both sides. Every wait is bounded and watches the process,
so a crashed or missing toolkit is a `Reply` with an error, never a hang or an exception.
"""

from __future__ import annotations

import inspect
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

import numpy as np

from rknn_client.toolkit.locate import INSTALL_HINT, Missing, Toolkit, locate

SYNC = "\x1erknn-bridge-sync"
ARRAY = "$ndarray"
CUSTOM_OP = "$custom_op"
START_TIMEOUT_S = 300.0  # importing rknn.api imports torch: slow on a busy machine
CALL_TIMEOUT_S = 3600.0  # a big model's build takes minutes; a stuck worker is stopped after this
SYNC_TIMEOUT_S = 10.0


@dataclass
class Reply:
    """What one call gave: `ok` and `value` (the toolkit's return value, arrays as numpy), else `error`;
    `lines` are the toolkit's printed lines during the call, as (stream, text) pairs."""

    ok: bool
    value: Any = None
    error: str = ""
    lines: list[tuple[str, str]] = field(default_factory=list)


class _Stream:
    """Forwards one of the worker's output streams to ours as it arrives, keeping each call's lines
    (those before the call's sync marker; what follows it belongs to the next call)."""

    def __init__(self, name: str, pipe: IO[bytes], target: Callable[[], IO[str]]) -> None:
        self.name = name
        self.target = target
        self.current: list[str] = []
        self.finished: dict[int, str] = {}
        self.ended = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._pump, args=(pipe,), daemon=True)
        self.thread.start()

    def _emit(self, text: str) -> None:
        out = self.target()
        out.write(text)
        out.flush()
        with self.cond:
            self.current.append(text)

    def _pump(self, pipe: IO[bytes]) -> None:
        pending = ""
        while chunk := os.read(pipe.fileno(), 65536):
            pending += chunk.decode("utf-8", errors="replace")
            cut = max(pending.rfind("\n"), pending.rfind("\r"))
            if cut >= 0:
                self._take(pending[: cut + 1])
                pending = pending[cut + 1 :]
            if pending and "\x1e" not in pending:  # a partial line (a prompt, a progress bar): show it now
                self._emit(pending)
                pending = ""
        if pending:
            self._emit(pending)
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def _take(self, text: str) -> None:
        while (at := text.find(SYNC)) >= 0:
            end = text.find("\n", at)
            if at:
                self._emit(text[:at])
            with self.cond:
                self.finished[int(text[at + len(SYNC) : end].strip() or -1)] = "".join(self.current)
                self.current = []
                self.cond.notify_all()
            text = text[end + 1 :]
        if text:
            self._emit(text)

    def take_lines(self, call_id: int | None, timeout: float) -> list[str]:
        """The lines of call `call_id` (waiting up to `timeout` for its marker); None: everything left
        once the stream ends (the worker died mid-call)."""
        with self.cond:
            if call_id is None:
                self.cond.wait_for(lambda: self.ended, timeout)
                text = "".join(self.finished.pop(k) for k in sorted(self.finished)) + "".join(self.current)
                self.current = []
            else:
                self.cond.wait_for(lambda: call_id in self.finished or self.ended, timeout)
                text = self.finished.pop(call_id, "")
        return text.splitlines()


def _worker_script() -> Path:
    return Path(str(resources.files("rknn_client.toolkit").joinpath("worker.py")))


class ToolkitBridge:
    """A running worker. Make one with `ToolkitBridge.start()`; call toolkit methods with `call()`."""

    def __init__(
        self,
        toolkit: Toolkit,
        process: subprocess.Popen[bytes],
        request_fd: int,
        reply_fd: int,
        scratch: Path,
    ) -> None:
        self.toolkit = toolkit
        self.process = process
        self.scratch = scratch
        self.info: dict[str, Any] = {}  # the worker's hello: toolkit and Python versions
        self._stopped_because: str | None = None
        self._sent_files: list[Path] = []
        self._requests = os.fdopen(request_fd, "w", encoding="utf-8")
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read_replies, args=(reply_fd,), daemon=True).start()
        assert process.stdout is not None and process.stderr is not None
        self._streams = [
            _Stream("stdout", process.stdout, lambda: sys.stdout),
            _Stream("stderr", process.stderr, lambda: sys.stderr),
        ]
        self._next_id = 0
        self._sent = 0
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls,
        toolkit: Toolkit | Missing | None = None,
        *,
        verbose: bool | str = False,
        verbose_file: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> ToolkitBridge | Missing:
        """Start a worker for `toolkit` (default: what `locate()` finds) with an RKNN(verbose, verbose_file)
        in it. Missing (with the reason and the install hint) when there is no toolkit or it cannot start."""
        found = locate() if toolkit is None else toolkit
        if isinstance(found, Missing):
            return found
        scratch = Path(tempfile.mkdtemp(prefix="rknn-toolkit-bridge-"))
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        try:
            process = subprocess.Popen(
                [
                    str(found.python),
                    "-I",
                    "-u",
                    str(_worker_script()),
                    str(request_r),
                    str(reply_w),
                    str(scratch),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(request_r, reply_w),
                env=env,
            )
        except OSError as error:
            for fd in (request_r, request_w, reply_r, reply_w):
                os.close(fd)
            shutil.rmtree(scratch, ignore_errors=True)
            return Missing(f"{found.python} cannot be run ({error.strerror})")
        os.close(request_r)
        os.close(reply_w)
        bridge = cls(found, process, request_w, reply_r, scratch)
        ready = bridge._wait_reply(start_timeout_s)
        if ready is None or not ready.get("ready"):
            detail = (ready or {}).get("error") or bridge._death_note("while importing rknn.api")
            said = [text for stream, text in bridge._collect(None) if stream == "stderr" and text.strip()]
            if ready is None and said:
                detail += f": {said[-1].strip()}"
            bridge.close()
            return Missing(f"the toolkit in {found.python} could not start: {detail}")
        bridge.info = ready
        made = bridge.call("new", verbose=verbose, verbose_file=verbose_file)
        if not made.ok:
            bridge.close()
            return Missing(f"RKNN() failed in the toolkit: {made.error}")
        return bridge

    # -- the pipes ---------------------------------------------------------------------------------

    def _read_replies(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8") as replies:
            for line in replies:
                try:
                    self._replies.put(json.loads(line))
                except ValueError:
                    self._replies.put(
                        {"ok": False, "error": f"unreadable reply from the worker: {line[:200]!r}"}
                    )
        self._replies.put(None)

    def _wait_reply(self, timeout: float) -> dict[str, Any] | None:
        """The next reply, or None when the worker ended or `timeout` passed (then it is stopped)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                reply = self._replies.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.process.poll() is not None and self._replies.empty():
                    time.sleep(0.1)  # a last reply may still be on its way through the reader thread
                    if self._replies.empty():
                        return None
                continue
            if reply is None:  # the reply pipe closed: the worker is ending, let it say how
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._stop("it closed its reply pipe but kept running")
            return reply
        self._stop(f"no answer within {timeout:g}s")
        return None

    def _death_note(self, doing: str) -> str:
        code = self.process.poll()
        if code is None:
            return f"the worker stopped answering {doing}"
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return f"the toolkit worker ended {doing} ({how})"

    def _stop(self, why: str) -> None:
        self._stopped_because = why
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    # -- arguments ---------------------------------------------------------------------------------

    def _encode(self, value: Any) -> Any:
        if isinstance(value, np.ndarray):
            self._sent += 1
            path = self.scratch / f"in-{self._sent}.npy"
            np.save(path, np.ascontiguousarray(value), allow_pickle=False)
            self._sent_files.append(path)
            return {ARRAY: str(path)}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, (list, tuple)):
            return [self._encode(v) for v in value]
        if isinstance(value, dict):
            return {str(k): self._encode(v) for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if hasattr(value, "op_type") and hasattr(value, "compute"):  # a custom op instance
            cls = type(value)
            try:
                source = textwrap.dedent(inspect.getsource(cls))
            except (OSError, TypeError):
                raise TypeError(f"the source of custom op class {cls.__name__} cannot be read") from None
            return {CUSTOM_OP: {"name": cls.__name__, "source": source}}
        raise TypeError(
            f"{type(value).__name__} cannot cross to the toolkit (expected JSON values or arrays)"
        )

    def _decode(self, value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {ARRAY}:
                path = Path(value[ARRAY])
                if path.parent != self.scratch:  # only the worker's own result files are read (and removed)
                    raise ValueError(f"the worker named an array outside its scratch dir: {path}")
                array = np.load(path, allow_pickle=False)
                path.unlink(missing_ok=True)
                return array
            return {k: self._decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._decode(v) for v in value]
        return value

    # -- the API -----------------------------------------------------------------------------------

    def call(self, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S, **kwargs: Any) -> Reply:
        """Call `RKNN.<method>(*args, **kwargs)` in the toolkit. The toolkit's lines are printed as they
        come and also returned; an exception the toolkit raised, a crash or a timeout is an error Reply."""
        with self._lock:
            if self.process.poll() is not None:
                return Reply(False, error=self._gone(method))
            try:
                request = {
                    "method": method,
                    "args": self._encode(list(args)),
                    "kwargs": self._encode(kwargs),
                    "cwd": os.getcwd(),
                }
            except (TypeError, OSError) as error:
                return Reply(False, error=f"{method}: {error}")
            self._next_id += 1
            request["id"] = self._next_id
            try:
                self._requests.write(json.dumps(request) + "\n")
                self._requests.flush()
            except (BrokenPipeError, OSError):
                return Reply(False, error=self._gone(method))
            answer = self._wait_reply(timeout_s)
            for path in self._sent_files:  # a long inference loop must not fill the disk
                path.unlink(missing_ok=True)
            self._sent_files.clear()
            lines = self._collect(self._next_id if answer is not None else None)
            if answer is None:
                return Reply(False, error=self._gone(method), lines=lines)
            if not answer.get("ok"):
                return Reply(False, error=str(answer.get("error")), lines=lines)
            try:
                value = self._decode(answer.get("value"))
            except (OSError, ValueError) as error:
                return Reply(
                    False, error=f"{method}: unreadable result from the toolkit worker: {error}", lines=lines
                )
            return Reply(True, value=value, lines=lines)

    def _collect(self, call_id: int | None) -> list[tuple[str, str]]:
        timeout = SYNC_TIMEOUT_S if call_id is not None else 2.0
        return [(s.name, line) for s in self._streams for line in s.take_lines(call_id, timeout)]

    def _gone(self, method: str) -> str:
        why = self._stopped_because
        note = f"the toolkit worker was stopped: {why}" if why else self._death_note(f"during {method}")
        return f"{method}: {note}; its RKNN state is lost. If this repeats, {INSTALL_HINT}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout_s: float = 30.0) -> None:
        """release() in the toolkit, then the worker ends; killed if it does not within `timeout_s`."""
        if self.process.poll() is None:
            with self._lock:
                try:
                    self._next_id += 1
                    self._requests.write(json.dumps({"id": self._next_id, "method": "release"}) + "\n")
                    self._requests.flush()
                    self._requests.close()
                    self._wait_reply(timeout_s)
                    self.process.wait(timeout=timeout_s)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in self._streams:
            stream.thread.join(timeout=5)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> ToolkitBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
