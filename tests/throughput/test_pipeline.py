"""Pipelined inference against a real daemon: order, frame ids, half-close, cancellation, errors
mid-stream, and the toolkit's async_mode."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from rknn_client import RKNN, connect
from rknn_client.errors import InvalidInput, RknnError
from rknn_client.frame_spec import FrameSpec
from rknn_proto import codec, rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import PROTOCOL_VERSION, PROTOCOL_VERSION_METADATA_KEY
from rknn_server.testing import DaemonProcess
from tests.conftest import DaemonFactory


def reference(daemon: DaemonProcess, model: Path, images: list[np.ndarray]) -> list[list[np.ndarray]]:
    with connect(daemon.url) as device, device.load(model) as session:
        return [session.run([x]) for x in images]


def assert_same(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(g, w, strict=True))


@pytest.mark.parametrize("depth", [1, 3, 16])
def test_map_returns_every_frame_in_order(host_daemon, camera_model, images, depth):
    want = reference(host_daemon, camera_model, images)
    # Frames differ from each other, so any reordering or loss shows.
    assert len({w[0].tobytes() for w in want}) == len(images)
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        got = list(session.map(([x] for x in images), depth=depth))
    assert_same(got, want)


def test_frame_ids_count_from_one_and_half_close_delivers_all(host_daemon, camera_model, images):
    want = reference(host_daemon, camera_model, images[:5])
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        pipeline = session.pipeline(depth=5)
        ids = [pipeline.submit([x]) for x in images[:5]]
        pipeline.finish()
        results = [pipeline.result() for _ in ids]
        assert pipeline.in_flight == 0
        pipeline.close()
    assert ids == [1, 2, 3, 4, 5]
    assert [frame_id for frame_id, _ in results] == ids
    assert_same([outputs for _, outputs in results], want)


def test_cancelled_stream_leaves_the_session_usable(make_daemon: DaemonFactory, camera_model, images):
    daemon = make_daemon()
    want = reference(daemon, camera_model, images)
    with connect(daemon.url) as device, device.load(camera_model) as session:
        stream = session.map(([x] for x in images), depth=4)
        first_two = [next(stream), next(stream)]
        stream.close()  # frames 3..6 are in flight: cancelled
        assert_same(first_two, want[:2])
        # Nothing of the cancelled stream leaks into the next one: all frames, in order.
        assert_same(list(session.map([x] for x in images)), want)
        assert_same([session.run([images[0]])], want[:1])
    # The cancelled stream may be logged after the next one: it ends when its cancellation lands.
    cancelled, finished = sorted(_pipeline_calls(daemon), key=lambda c: c[1] == len(images))
    assert finished == ("OK", len(images))
    # The daemon may have answered every whole frame it was sent before the cancellation reached it
    # (the client had submitted six and read two; gRPC's request thread may have sent fewer than six
    # when the cancel came): gRPC then ends the call as the handler left it, and the cancel cuts
    # nothing short. A cancel that cut a frame short is CANCELLED, never OK and never an error.
    errors = [line for line in daemon.log_text().splitlines() if '_error"' in line]  # what broke it, if any
    assert cancelled[0] == "CANCELLED" or (cancelled[0] == "OK" and 2 <= cancelled[1] <= 2 + 4), (
        cancelled,
        errors,
    )


def frame_requests(session, inputs: list[np.ndarray], **options: Any) -> list[rknn_pb2.InferenceRequest]:
    """A frame's request messages as the client writes them, for a stub driven by hand."""
    frame_id = options.pop("frame_id", 0)
    messages = session.frame_bytes(FrameSpec(inputs, **options), frame_id)
    return [rknn_pb2.InferenceRequest.FromString(m) for m in messages]


def _half_frame(session, image: np.ndarray) -> list[rknn_pb2.InferenceRequest]:
    """The header of a frame and the first half of its input's bytes."""
    header, *chunks = frame_requests(session, [image], frame_id=1)
    data = b"".join(m.chunk.data for m in chunks)
    return [header, rknn_pb2.InferenceRequest(chunk=rknn_pb2.TensorChunk(data=data[: len(data) // 2]))]


def _pipeline_calls(daemon: DaemonProcess) -> list[tuple[str, int]]:
    """Each InferencePipeline call's outcome and the frames it answered, from the daemon's log."""
    daemon.stop()
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    return [(e["outcome"], e["frames"] or 0) for e in events if e.get("method") == "InferencePipeline"]


def test_cancel_inside_a_frame_is_logged_as_cancelled(make_daemon: DaemonFactory, camera_model, images):
    """The client cancels while the daemon holds half a frame: gRPC may end the request stream before
    the cancellation reaches the handler, which must not read as the client's truncated frame."""
    daemon = make_daemon()
    with connect(daemon.url) as device, device.load(camera_model) as session:
        messages = _half_frame(session, images[0])
        with grpc.insecure_channel(daemon.address) as channel:
            stub = rknn_pb2_grpc.RknnServerStub(channel)
            for _ in range(20):
                sent = threading.Event()
                release = threading.Event()

                def requests(
                    sent: threading.Event, release: threading.Event
                ) -> Iterator[rknn_pb2.InferenceRequest]:
                    yield from messages
                    sent.set()
                    release.wait(30)

                call = stub.InferencePipeline(requests(sent, release), timeout=60)
                assert sent.wait(30)
                time.sleep(0.05)  # let the half frame reach the daemon (not needed for the outcome)
                call.cancel()
                release.set()
                assert call.code() == grpc.StatusCode.CANCELLED
        assert_same([session.run([images[0]])], [session.run([images[0]])])
    outcomes = [outcome for outcome, _ in _pipeline_calls(daemon)]
    assert outcomes and set(outcomes) == {"CANCELLED"}, outcomes


def test_stream_ended_inside_a_frame_is_the_clients_error(host_daemon, camera_model, images):
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        messages = _half_frame(session, images[0])
        with grpc.insecure_channel(host_daemon.address) as channel:
            stub = rknn_pb2_grpc.RknnServerStub(channel)
            with pytest.raises(grpc.RpcError) as failure:
                list(stub.InferencePipeline(iter(messages), timeout=60))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the stream ended inside frame 1 (input 0: 6144 of 12288 bytes)" in failure.value.details()


def test_bad_frame_mid_stream_answers_earlier_frames_then_fails(host_daemon, camera_model, images):
    want = reference(host_daemon, camera_model, images[:2])
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        wrong = np.zeros((1, 3, 8, 8), dtype=np.uint8)
        frames = [frame_requests(session, [x], frame_id=i + 1) for i, x in enumerate(images[:2])]
        frames.append(frame_requests(session, [wrong], strict=False, frame_id=3))
        with grpc.insecure_channel(host_daemon.address) as channel:
            stub = rknn_pb2_grpc.RknnServerStub(channel)
            metadata = ((PROTOCOL_VERSION_METADATA_KEY, str(PROTOCOL_VERSION)),)
            responses = stub.InferencePipeline(iter([m for f in frames for m in f]), metadata=metadata)
            got: list[tuple[int, list[np.ndarray]]] = []
            with pytest.raises(grpc.RpcError) as failure:
                for response in responses:
                    if response.WhichOneof("part") == "header":
                        assembler = codec.TensorAssembler(response.header.outputs, codec.TensorLimits())
                        got.append((response.header.frame_id, []))
                    else:
                        assembler.add(response.chunk)
                    if assembler.complete:
                        got[-1][1].extend(assembler.arrays())
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "[1, 3, 8, 8]" in failure.value.details()
        assert [frame_id for frame_id, _ in got] == [1, 2]
        assert_same([outputs for _, outputs in got], want)
        assert_same([session.run([images[0]])], want[:1])


def test_chunk_before_header_is_refused(host_daemon):
    with grpc.insecure_channel(host_daemon.address) as channel:
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        chunk = rknn_pb2.InferenceRequest(chunk=rknn_pb2.TensorChunk(data=b"x"))
        with pytest.raises(grpc.RpcError) as failure:
            list(stub.InferencePipeline(iter([chunk])))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "before any InferenceHeader" in failure.value.details()


def test_pipeline_checks_inputs_before_sending(host_daemon, camera_model):
    with connect(host_daemon.url) as device, device.load(camera_model) as session:
        with pytest.raises(InvalidInput):
            session.pipeline(depth=0)
        pipeline = session.pipeline()
        with pytest.raises(InvalidInput, match="the model expects uint8"):
            pipeline.submit([np.zeros((1, 3, 64, 64), dtype=np.float32)])
        with pytest.raises(RknnError, match="no frame is in flight"):
            pipeline.result()
        pipeline.close()


def test_toolkit_async_mode_returns_the_previous_frame_with_its_id(host_daemon, camera_model, images):
    want = reference(host_daemon, camera_model, images[:6])
    rknn = RKNN()
    assert rknn.load_onnx(str(camera_model)) == 0
    assert rknn.init_runtime(device_id=host_daemon.url, async_mode=True) == 0
    # data_format nchw: the images are already in the model's layout.
    results = [rknn.inference([x], data_format="nchw", get_frame_id=True) for x in images[:6]]
    sync = RKNN()
    assert sync.load_onnx(str(camera_model)) == 0
    assert sync.init_runtime(device_id=host_daemon.url) == 0
    sync_results = [sync.inference([x], data_format="nchw", get_frame_id=True) for x in images[:2]]
    rknn.release()
    sync.release()
    # Call 1 returns its own frame; from call 2 on, each returns the frame before it.
    assert [r[-1] for r in results] == [1, 1, 2, 3, 4, 5]
    for result in results:
        frame_id = result[-1]
        assert np.array_equal(result[0], want[frame_id - 1][0])
    assert [r[-1] for r in sync_results] == [1, 2]
    assert np.array_equal(sync_results[1][0], want[1][0])
