"""The floor of a doorbell frame: ONNX Runtime in another process, woken by one unix-socket message.

No daemon code at all: a child process holds the same model in an InferenceSession with the
daemon's options and, for each 2-byte SOCK_SEQPACKET message, runs it once and answers 2 bytes. Its
p50 against in-process ONNX Runtime (alternated) is the best a doorbell frame can do here: what a
process boundary and two wake-ups cost, with the cores shared as the daemon shares them.

    python -m bench.ring_floor CHILD_FD MODEL SHAPE   (the child's side, started by `measure`)
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.side_by_side import side_by_side
from rknn_server.runtime.host import default_threads
from rknn_server.runtime.host_model import session_options


def _session(model: Path) -> tuple[ort.InferenceSession, str]:
    session = ort.InferenceSession(
        str(model), session_options(default_threads()), providers=["CPUExecutionProvider"]
    )
    return session, session.get_inputs()[0].name


def measure(model: Path, x: np.ndarray, runs: int, warm: int = 20) -> tuple[float, float]:
    """(in-process p50, rung-in-a-child p50) in seconds, alternated."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    shape = ",".join(map(str, x.shape))
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.ring_floor", str(theirs.fileno()), str(model), shape],
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    try:
        ours.settimeout(120)
        if ours.recv(16) != b"up":
            raise RuntimeError("the ring-floor child did not start")
        local, name = _session(model)

        def ring() -> None:
            ours.send(b"go")
            ours.recv(16)

        return side_by_side(lambda: local.run(None, {name: x}), ring, runs, warm)
    finally:
        ours.close()  # the child's recv sees the end and it exits
        child.wait(60)


def _child(fd: int, model: Path, shape: tuple[int, ...]) -> None:
    bell = socket.socket(fileno=fd)
    session, name = _session(model)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    bell.send(b"up")
    while bell.recv(16):
        session.run(None, {name: x})
        bell.send(b"ok")


if __name__ == "__main__":
    _child(int(sys.argv[1]), Path(sys.argv[2]), tuple(int(n) for n in sys.argv[3].split(",")))
