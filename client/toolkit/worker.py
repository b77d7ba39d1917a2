"""The toolkit side of the bridge: run by RKNN-Toolkit2's own interpreter, never imported by rknn_client.

`python -I -u worker.py REQUEST_FD REPLY_FD` imports `rknn.api`, says it is ready, then serves one
JSON line per request on REQUEST_FD with one JSON line per reply on REPLY_FD. The toolkit's printed
lines stay on this process's stdout/stderr (the client streams them to the user as they come); after
each call both streams get a sync marker so the client knows it has every line of that call.
Arrays cross as `.npy` files (`{"$ndarray": path}`, loaded without pickle). Standard library and
numpy only: this file must run on whatever Python the toolkit has (3.7 or newer).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import Any

SYNC = "\x1erknn-bridge-sync"
ARRAY = "$ndarray"
CUSTOM_OP = "$custom_op"

# What a client may call on the RKNN object (anything else is refused, not looked up).
METHODS = frozenset(
    [
        "config",
        "load_onnx",
        "load_pytorch",
        "load_tflite",
        "load_tensorflow",
        "load_caffe",
        "load_darknet",
        "load_rknn",
        "build",
        "export_rknn",
        "hybrid_quantization_step1",
        "hybrid_quantization_step2",
        "export_encrypted_rknn_model",
        "codegen",
        "reg_custom_op",
        "init_runtime",
        "inference",
        "accuracy_analysis",
        "get_sdk_version",
        "optimize_onnx",
        "clear_op_cache",
    ]
)


def _exit_with_parent(parent: int) -> None:
    """The worker must not outlive the client, even in the middle of a long build."""
    while True:
        if os.getppid() != parent:
            os._exit(70)
        time.sleep(0.5)


def _flush_streams(call_id: int) -> None:
    """Everything printed so far (Python and C stdio) goes out, then the marker for this call."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
    for fd in (1, 2):
        os.write(fd, f"{SYNC} {call_id}\n".encode())


def _reason(error: BaseException) -> str:
    """The exception as one message; the toolkit puts whole tracebacks in its messages: keep their end."""
    text = str(error).strip()
    if "Traceback (most recent call last)" in text:
        lines = text.splitlines()
        frames = [i for i, line in enumerate(lines) if line.lstrip().startswith("File ")]
        text = "\n".join(lines[frames[-1] + 1 :] if frames else lines).strip()
        if text.startswith(f"{type(error).__name__}: "):
            return text
    return f"{type(error).__name__}: {text}"


class Worker:
    def __init__(self, reply_fd: int, scratch: str) -> None:
        self.reply = os.fdopen(reply_fd, "w", encoding="utf-8")
        self.scratch = scratch
        self.rknn = None
        self.saved = 0
        self.version = "unknown"

    def send(self, message: dict) -> None:
        self.reply.write(json.dumps(message) + "\n")
        self.reply.flush()

    def decode(self, value: Any) -> Any:
        import numpy as np

        if isinstance(value, dict):
            if set(value) == {ARRAY}:
                return np.load(value[ARRAY], allow_pickle=False)
            if set(value) == {CUSTOM_OP}:
                return self.custom_op(value[CUSTOM_OP])
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        return value

    def encode(self, value: Any) -> Any:
        import numpy as np

        if isinstance(value, np.ndarray):
            self.saved += 1
            path = os.path.join(self.scratch, f"out-{self.saved}.npy")
            np.save(path, value, allow_pickle=False)
            return {ARRAY: path}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, (list, tuple)):
            return [self.encode(v) for v in value]
        if isinstance(value, dict):
            return {str(k): self.encode(v) for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return repr(value)

    @staticmethod
    def custom_op(spec: dict) -> Any:
        """A custom op class sent as its source: defined here beside numpy and the toolkit's helpers."""
        import numpy as np
        from rknn.api import custom_op

        namespace: dict[str, Any] = {"np": np, "numpy": np}
        namespace.update({k: v for k, v in vars(custom_op).items() if not k.startswith("__")})
        exec(compile(spec["source"], "<custom op {}>".format(spec["name"]), "exec"), namespace)
        return namespace[spec["name"]]()

    def handle(self, request: dict) -> dict[str, Any]:
        method = request.get("method")
        if method == "new":
            from rknn.api import RKNN

            self.rknn = RKNN(**self.decode(request.get("kwargs") or {}))
            return {"ok": True, "value": 0}
        if method not in METHODS:
            return {"ok": False, "error": f"the bridge has no method {method!r}"}
        if self.rknn is None:
            return {"ok": False, "error": "no RKNN object yet (call 'new' first)"}
        if not hasattr(self.rknn, method):
            return {"ok": False, "error": f"rknn-toolkit2 {self.version} has no RKNN.{method}()"}
        os.chdir(request.get("cwd") or os.getcwd())
        args = self.decode(request.get("args") or [])
        kwargs = self.decode(request.get("kwargs") or {})
        value = getattr(self.rknn, method)(*args, **kwargs)
        return {"ok": True, "value": self.encode(value)}

    def serve(self, requests: Iterable[str]) -> None:
        for line in requests:
            request = json.loads(line)
            call_id = int(request.get("id", 0))
            if request.get("method") == "release":
                reply: dict[str, Any] = {"ok": True, "value": None}
                try:
                    if self.rknn is not None:
                        self.rknn.release()
                except Exception as error:
                    reply = {"ok": False, "error": _reason(error)}
                _flush_streams(call_id)
                self.send({"id": call_id, **reply})
                return
            try:
                reply = self.handle(request)
            except BaseException as error:  # the toolkit raises where it should return -1
                reply = {"ok": False, "error": _reason(error)}
                if isinstance(error, (KeyboardInterrupt, SystemExit)):
                    reply["fatal"] = True
            _flush_streams(call_id)
            reply["id"] = call_id
            self.send(reply)
            if reply.get("fatal"):
                return


def main() -> int:
    request_fd, reply_fd, scratch = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    worker = Worker(reply_fd, scratch)
    try:
        import numpy  # noqa: F401
        from rknn.api import RKNN  # noqa: F401

        try:
            from importlib.metadata import version

            worker.version = version("rknn-toolkit2")
        except Exception:
            pass
    except BaseException as error:
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        worker.send({"ready": False, "error": last})
        return 3
    worker.send(
        {
            "ready": True,
            "toolkit": worker.version,
            "python": sys.version.split()[0],
        }
    )
    with os.fdopen(request_fd, "r", encoding="utf-8") as requests:
        worker.serve(requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
