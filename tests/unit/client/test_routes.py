"""A session's route, chosen once from what the daemon said (GetInfo's protocol and limits,
InitRuntime's output sizes): the unary/stream limit (outputs of unknown size do not fall to the slower
stream), shared memory only where the device may use it, and a fresh choice after a re-open."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rknn_client import routes
from rknn_client.device import DeviceInfo
from rknn_client.local import shared_memory
from rknn_client.session import Session
from rknn_proto import codec, convert, framing, rknn_pb2
from rknn_proto.messages import TensorAttr
from rknn_proto.version import PROTOCOL_VERSION, RUN_RPC_VERSION


def info(protocol: int, max_message_bytes: int = 8 << 20) -> DeviceInfo:
    return DeviceInfo(
        "", protocol, "host", "", "", "", "", (), {}, {"max_message_bytes": max_message_bytes}, 0, ""
    )


def outputs(shapes: list[list[int]], quantized: bool = False) -> list[TensorAttr]:
    return [
        convert.tensor_attr_from_wire(
            rknn_pb2.TensorAttr(
                index=i,
                shape=shape,
                dtype=codec.dtype_to_wire(np.dtype(np.int8 if quantized else np.float32)),
                quant_type=rknn_pb2.QUANT_TYPE_AFFINE_ASYMMETRIC if quantized else rknn_pb2.QUANT_TYPE_NONE,
            )
        )
        for i, shape in enumerate(shapes)
    ]


def limit(shapes: list[list[int]], daemon: DeviceInfo, quantized: bool = False) -> int:
    # Dequantized on the daemon (native_outputs False): a quantized output travels as float32.
    return routes.unary_limit(daemon, outputs(shapes, quantized), native_outputs=False)


def test_outputs_of_unknown_size_go_unary_on_a_daemon_that_answers_any_size() -> None:
    assert limit([[1, -1, 4]], info(PROTOCOL_VERSION)) >= 602_112


def test_an_older_daemon_gets_run_only_for_outputs_its_run_answers() -> None:
    assert limit([[1, -1, 4]], info(RUN_RPC_VERSION)) == -1
    assert limit([[10]], info(RUN_RPC_VERSION - 1)) == -1
    assert limit([[1, 1000]], info(RUN_RPC_VERSION)) > 0
    # Its Run refused (after computing) outputs over half its max_message_bytes.
    assert limit([[1, 1000]], info(RUN_RPC_VERSION, max_message_bytes=6000)) == -1


@pytest.mark.parametrize(
    ("shapes", "quantized", "unary"),
    [
        ([[1, 1000]], False, True),
        ([[1, codec.SMALL_TRANSFER_BYTES // 4]], False, False),  # large known outputs: the stream
        ([[1, codec.SMALL_TRANSFER_BYTES // 2]], True, False),  # int8, but dequantized to float32
        ([[1, codec.SMALL_TRANSFER_BYTES // 8]], True, True),
    ],
)
def test_known_outputs_choose_by_size_as_they_travel(shapes, quantized: bool, unary: bool) -> None:
    assert (limit(shapes, info(PROTOCOL_VERSION), quantized) >= 100) is unary


def test_inputs_go_unary_only_within_the_daemons_message_limit() -> None:
    assert limit([[10]], info(PROTOCOL_VERSION, max_message_bytes=1 << 20)) == (1 << 20) - (64 << 10)
    assert limit([[10]], info(PROTOCOL_VERSION)) == codec.SMALL_TRANSFER_BYTES - 1


class FakeDevice:
    """A daemon answering every unary Run with the model's one output, counting what it is asked."""

    def __init__(self, shm: bool) -> None:
        self.instance_id = ""
        self.infos = 0
        self.runs = 0
        self.shm = shared_memory.DeviceState(usable=shm)
        self.endpoint = SimpleNamespace(description="fake")

    def info(self, refresh: bool = False) -> DeviceInfo:
        self.infos += 1
        return info(PROTOCOL_VERSION)

    def run(self, request: bytes) -> framing.UnaryFrame[rknn_pb2.OutputsHeader]:
        self.runs += 1
        y = np.arange(4, dtype=np.float32)
        head = rknn_pb2.OutputsHeader(outputs=[codec.meta_of(y, "y", "UNDEFINED", False)], run_time_us=7)
        return framing.UnaryFrame(head, [memoryview(y.tobytes())])


def reply(session_id: str) -> rknn_pb2.InitRuntimeResponse:
    spec = rknn_pb2.TensorAttr(
        index=0, name="x", shape=[1, 4], dtype=codec.dtype_to_wire(np.dtype(np.float32))
    )
    out = rknn_pb2.TensorAttr(index=0, name="y", shape=[4], dtype=codec.dtype_to_wire(np.dtype(np.float32)))
    return rknn_pb2.InitRuntimeResponse(session_id=session_id, inputs=[spec], outputs=[out])


def test_the_route_is_chosen_on_the_first_frame_and_kept() -> None:
    device = FakeDevice(shm=False)
    session = Session(device, reply("s"), native_outputs=False)  # type: ignore[arg-type]
    x = np.zeros((1, 4), np.float32)
    for _ in range(3):
        assert session.run([x])[0].tolist() == [0, 1, 2, 3]
    assert device.runs == 3 and device.infos == 1  # the daemon's limits asked for once
    assert isinstance(session._route, routes.WireRoute)
    assert session.last_run_time_us == 7


def test_shared_memory_is_the_route_only_where_the_device_may_use_it() -> None:
    on = Session(FakeDevice(shm=True), reply("s"), native_outputs=False)  # type: ignore[arg-type]
    off = Session(FakeDevice(shm=False), reply("s"), native_outputs=False)  # type: ignore[arg-type]
    assert isinstance(routes.route_for(on), routes.SharedMemoryRoute)
    assert isinstance(routes.route_for(off), routes.WireRoute)


def test_a_session_that_ran_is_freed_as_soon_as_it_is_dropped() -> None:
    """The route holds no reference back to its session: a dropped session (and the pool of its
    outputs' memory) goes at once, not at the next garbage collection."""
    import gc
    import weakref

    gc.disable()
    try:
        session = Session(FakeDevice(shm=False), reply("s"), native_outputs=False)  # type: ignore[arg-type]
        session.run([np.zeros((1, 4), np.float32)])
        gone = weakref.ref(session)
        del session
        assert gone() is None
    finally:
        gc.enable()


def test_a_reopened_session_chooses_its_route_again() -> None:
    device = FakeDevice(shm=False)
    session = Session(device, reply("s"), native_outputs=False)  # type: ignore[arg-type]
    session.run([np.zeros((1, 4), np.float32)])
    session._adopt(reply("s-2"))  # what re-opening on a restarted daemon does
    assert session._route is None
    session.run([np.zeros((1, 4), np.float32)])
    assert device.infos == 2
