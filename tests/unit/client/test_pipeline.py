"""Pipeline.close with frames in flight: the daemon is told "cancelled" before "no more frames"."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np

from rknn_client.frame_spec import FrameSpec
from rknn_client.pipeline import Pipeline

# How long the request stream is watched for an end it must not have at the cancel.
_WATCH_S = 0.3


class _Call:
    """A stream call whose requests are read by a thread of its own, as gRPC's are."""

    def __init__(self, requests: Iterator[bytes]) -> None:
        self.ended = threading.Event()
        self.ended_before_cancel: bool | None = None
        self._reader = threading.Thread(target=self._read, args=(requests,), daemon=True)
        self._reader.start()

    def _read(self, requests: Iterator[bytes]) -> None:
        for _ in requests:
            pass
        self.ended.set()

    def cancel(self) -> None:
        # Every message queued so far is read at once; the stream ends now only if its end was queued.
        self.ended_before_cancel = self.ended.wait(_WATCH_S)

    def __iter__(self) -> Iterator[bytes]:
        return iter(())

    def join(self) -> bool:
        self._reader.join(5)
        return self.ended.is_set()


def _fake_session() -> SimpleNamespace:
    calls: list[_Call] = []

    def inference_pipeline(requests: Iterator[bytes]) -> _Call:
        calls.append(_Call(requests))
        return calls[-1]

    return SimpleNamespace(
        device=SimpleNamespace(
            inference_pipeline=inference_pipeline, endpoint=SimpleNamespace(description="fake")
        ),
        new_output_assembler=None,
        frame_bytes=lambda frame, frame_id: iter([b"frame %d" % frame_id]),
        calls=calls,
    )


def test_close_with_frames_in_flight_cancels_before_ending_the_request_stream() -> None:
    session = _fake_session()
    pipeline = Pipeline(session, depth=4)  # type: ignore[arg-type]
    for _ in range(3):
        pipeline.submit_frame(FrameSpec([np.zeros(1, np.float32)]))
    pipeline.close()
    (call,) = session.calls
    assert call.ended_before_cancel is False
    assert call.join(), "the request stream must still end after the cancel (gRPC's reader thread exits)"
    assert not pipeline.accepting and pipeline.in_flight == 0
