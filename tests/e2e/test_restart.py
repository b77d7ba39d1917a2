"""A daemon restarted over its model cache: the host runtime's models it studied before open from
the facts it kept beside them (host_facts), without the onnx package, and answer as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rknn_client import connect
from tests.conftest import DaemonFactory

ONNX_EXTENSION = "onnx_cpp2py_export"  # the onnx package's C++ module: mapped once onnx is imported


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_restarted_daemon_opens_its_cached_models_without_onnx(
    make_daemon: DaemonFactory, cnn_model: Path
) -> None:
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    first = make_daemon(name="board")
    with connect(first.url) as device, device.load(cnn_model) as session:
        before = session.run([x])[0]
    assert ONNX_EXTENSION in _maps(first.pid)  # studied: onnx was needed
    first.stop()
    again = make_daemon(name="board")  # the same cache
    with connect(again.url) as device, device.load(cnn_model) as session:
        assert np.array_equal(session.run([x])[0], before)
        assert session.memory().weight_memory > 0  # the memory report, from the kept facts
    assert ONNX_EXTENSION not in _maps(again.pid)
