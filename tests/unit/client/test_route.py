"""The unary/stream choice, made once per session from what the daemon said (GetInfo's protocol
and limits, InitRuntime's output sizes): outputs of unknown size do not fall to the slower stream."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rknn_client.device import DeviceInfo
from rknn_client.session import Session
from rknn_proto import codec, rknn_pb2
from rknn_proto.version import PROTOCOL_VERSION, RUN_RPC_VERSION


def info(protocol: int, max_message_bytes: int = 8 << 20) -> DeviceInfo:
    return DeviceInfo(
        "", protocol, "host", "", "", "", "", (), {}, {"max_message_bytes": max_message_bytes}, 0, ""
    )


def session(outputs: list[list[int]], daemon: DeviceInfo, quantized: bool = False) -> Session:
    asked: list[int] = []

    def device_info() -> DeviceInfo:
        asked.append(1)
        return daemon

    reply = rknn_pb2.InitRuntimeResponse(
        session_id="s",
        outputs=[
            rknn_pb2.TensorAttr(
                index=i,
                shape=shape,
                dtype=codec.dtype_to_wire(np.dtype(np.int8 if quantized else np.float32)),
                quant_type=rknn_pb2.QUANT_TYPE_AFFINE_ASYMMETRIC if quantized else rknn_pb2.QUANT_TYPE_NONE,
            )
            for i, shape in enumerate(outputs)
        ],
    )
    device = SimpleNamespace(info=device_info, instance_id="")
    made = Session(device, reply, native_outputs=False)  # type: ignore[arg-type]
    made.asked = asked  # type: ignore[attr-defined]
    return made


def test_outputs_of_unknown_size_go_unary_on_a_daemon_that_answers_any_size() -> None:
    s = session([[1, -1, 4]], info(PROTOCOL_VERSION))
    assert s._goes_unary(602_112)
    assert s._goes_unary(1)
    assert s.asked == [1]  # type: ignore[attr-defined]  # decided once


def test_an_older_daemon_gets_run_only_for_outputs_its_run_answers() -> None:
    assert not session([[1, -1, 4]], info(RUN_RPC_VERSION))._goes_unary(1)
    assert not session([[10]], info(RUN_RPC_VERSION - 1))._goes_unary(1)
    assert session([[1, 1000]], info(RUN_RPC_VERSION))._goes_unary(1)
    # Its Run refused (after computing) outputs over half its max_message_bytes.
    assert not session([[1, 1000]], info(RUN_RPC_VERSION, max_message_bytes=6000))._goes_unary(1)


@pytest.mark.parametrize(
    ("outputs", "quantized", "unary"),
    [
        ([[1, 1000]], False, True),
        ([[1, codec.SMALL_TRANSFER_BYTES // 4]], False, False),  # large known outputs: the stream
        ([[1, codec.SMALL_TRANSFER_BYTES // 2]], True, False),  # int8, but dequantized to float32
        ([[1, codec.SMALL_TRANSFER_BYTES // 8]], True, True),
    ],
)
def test_known_outputs_choose_by_size_as_they_travel(outputs, quantized: bool, unary: bool) -> None:
    assert session(outputs, info(PROTOCOL_VERSION), quantized)._goes_unary(100) is unary


def test_inputs_go_unary_only_within_the_daemons_message_limit() -> None:
    s = session([[10]], info(PROTOCOL_VERSION, max_message_bytes=1 << 20))
    assert s._goes_unary((1 << 20) - (64 << 10))
    assert not s._goes_unary(1 << 20)
    assert not session([[10]], info(PROTOCOL_VERSION))._goes_unary(codec.SMALL_TRANSFER_BYTES)
