"""Memory amplification against a real daemon (issue #12 item 5): a tiny model or a few header bytes
must not make the daemon allocate (or keep) gigabytes. The figures are printed for the report; the
bounds are generous, so that they hold on a loaded machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from rknn_client.errors import ResourceExhausted
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_server.testing import DaemonProcess
from tests import models
from tests.reliability.conftest import StartDaemon, cnn_input, device

MB = 1 << 20
BOMB_ELEMENTS = 250_000_000  # 1 GB of float32 from a 200-byte model
FRAME_ELEMENTS = 100_000_000  # a 400 MB input frame


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def rss(daemon: DaemonProcess) -> int:
    return _status_kib(daemon.pid, "VmRSS") * 1024


def peak_rss(daemon: DaemonProcess) -> int:
    return _status_kib(daemon.pid, "VmHWM") * 1024


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_constant_of_shape_bomb_is_refused_before_load(
    daemons: StartDaemon, cnn: Path, tmp_path: Path
) -> None:
    daemon = daemons("--max-session-memory", "256MiB")
    bomb = models.constant_of_shape_bomb(tmp_path / "bomb.onnx", BOMB_ELEMENTS)
    with device(daemon) as dev:
        dev.upload(bomb)
        before = peak_rss(daemon)
        with pytest.raises(ResourceExhausted, match=r"max_session_memory=268435456 \(--max-session-memory\)"):
            dev.load(bomb)
        growth = peak_rss(daemon) - before
        print(
            f"\n{bomb.stat().st_size}-byte ConstantOfShape bomb: daemon peak RSS grew {growth / MB:.1f} MiB"
        )
        assert growth < 600 * MB
        with dev.load(cnn) as session:  # the daemon keeps serving
            assert session.run([cnn_input()])[0].shape == (1, 10)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_shape_input_run_is_refused_or_given_back(
    daemons: StartDaemon, tmp_path: Path, isolation: str
) -> None:
    """With a worker process the run hits the session's address-space budget; in the daemon's own
    threads it cannot be stopped, but (no memory arena) its peak does not stay held after the call."""
    daemon = daemons("--isolation", isolation, "--max-session-memory", "512MiB")
    model = models.shape_input_bomb(tmp_path / "shape.onnx")
    with device(daemon) as dev, dev.load(model) as session:
        assert session.run([np.array([1000], np.int64)])[0].shape == (1000,)
        baseline = rss(daemon)
        try:
            outcome = f"answered {session.run([np.array([BOMB_ELEMENTS], np.int64)])[0].nbytes} bytes"
        except ResourceExhausted as exc:
            outcome = f"refused: {exc}"
        after = rss(daemon)
        print(
            f"\nshape-as-input run ({isolation}): {outcome}; daemon RSS {baseline / MB:.0f} MiB before, "
            f"{after / MB:.0f} MiB after, peak {peak_rss(daemon) / MB:.0f} MiB"
        )
        if isolation == "process":
            assert "max_session_memory=536870912" in outcome
            assert peak_rss(daemon) - baseline < 600 * MB
        assert after - baseline < 300 * MB
        assert session.run([np.array([1000], np.int64)])[0].shape == (1000,)


def _stalled_frame(
    stub: rknn_pb2_grpc.RknnServerStub, session_id: str, release: threading.Event
) -> grpc.Future:
    """An Inference of a 400 MB frame whose client sends half of it and then nothing."""
    meta = rknn_pb2.TensorMeta(
        dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, FRAME_ELEMENTS], byte_length=4 * FRAME_ELEMENTS
    )
    chunk = bytes(MB)

    def requests() -> Iterator[rknn_pb2.InferenceRequest]:
        yield rknn_pb2.InferenceRequest(header=rknn_pb2.InferenceHeader(session_id=session_id, inputs=[meta]))
        for offset in range(0, 2 * FRAME_ELEMENTS, MB):
            yield rknn_pb2.InferenceRequest(
                chunk=rknn_pb2.TensorChunk(tensor_index=0, offset=offset, data=chunk)
            )
        release.wait(120)

    call: grpc.Future = stub.Inference(requests(), timeout=120)
    return call


def test_stalled_half_frames_are_bounded_and_dropped(daemons: StartDaemon, tmp_path: Path) -> None:
    daemon = daemons("--max-memory", "600MiB", "--stream-idle-timeout", "3")
    model = models.big_identity(tmp_path / "big.onnx", FRAME_ELEMENTS)
    release = threading.Event()
    with device(daemon) as dev, dev.load(model) as session, grpc.insecure_channel(daemon.address) as channel:
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        baseline = rss(daemon)
        try:
            first = _stalled_frame(stub, session.id, release)
            _wait_for(lambda: rss(daemon) - baseline > 150 * MB, 60, "the first half frame arrived")
            second = _stalled_frame(stub, session.id, release)
            assert second.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert "max_memory=629145600 (--max-memory)" in second.details()  # type: ignore[attr-defined]
            held = rss(daemon)
            assert first.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
            assert "--stream-idle-timeout" in first.details()  # type: ignore[attr-defined]
            _wait_for(lambda: rss(daemon) - baseline < 100 * MB, 30, "the stalled frame's buffers were freed")
        finally:
            release.set()
        peak = peak_rss(daemon) - baseline
        print(
            f"\ntwo stalled 400 MB half frames: daemon RSS +{(held - baseline) / MB:.0f} MiB while stalled, "
            f"peak +{peak / MB:.0f} MiB, +{(rss(daemon) - baseline) / MB:.0f} MiB after the idle timeout"
        )
        assert peak < 600 * MB
        assert session.run([np.ones((1, FRAME_ELEMENTS), np.float32)])[0].shape == (1, FRAME_ELEMENTS)


def test_extra_sessions_of_a_cached_model_cost_a_small_fraction_of_it(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    """Eight callers of one model hold it once: the runtime is shared by the sessions of one file."""
    daemon = daemons()
    weights = 2_000_000 * 4 * 4  # a 32 MB table the input picks a row of (nothing ONNX Runtime can fold)
    model = models.save_graph(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Gather", ["table", "row"], ["y"])],
            "lookup",
            [onnx.helper.make_tensor_value_info("row", onnx.TensorProto.INT64, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
            [onnx.numpy_helper.from_array(np.ones((2_000_000, 4), np.float32), "table")],
        ),
        tmp_path / "lookup.onnx",
    )
    callers = [device(daemon) for _ in range(8)]
    try:
        sessions = [callers[0].load(model)]
        assert sessions[0].run([np.array([7], np.int64)])[0].shape == (1, 4)
        one = rss(daemon)
        sessions += [caller.load(model) for caller in callers[1:]]
        for session in sessions:
            assert session.run([np.array([7], np.int64)])[0].shape == (1, 4)
        per_session = (rss(daemon) - one) / 7
        print(f"\nRSS per extra session of a {weights / MB:.0f} MiB model: {per_session / MB:.2f} MiB")
        assert per_session < 0.15 * weights
    finally:
        for caller in callers:
            caller.close()
