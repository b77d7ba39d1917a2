"""In-process: ModelInfer's request as the daemon reads it (parse_infer_request): the message as
protobuf parses it, its raw inputs left in the received bytes; their arrays (to_array) used there
when the address suits the datatype, else one aligned copy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from rknn_proto.codec import TensorLimits
from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_server.protocols.kserve.grpc_service import decode_inputs, parse_infer_request
from rknn_server.protocols.kserve.models import to_array

LIMITS = TensorLimits()


def _address(data: bytes | memoryview) -> int:
    return int(np.frombuffer(data, np.uint8).ctypes.data)


def _request(raw: bytes, datatype: str, id_length: int) -> bytes:
    request = pb.ModelInferRequest(
        model_name="mobilenet",
        id="i" * id_length,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=[len(raw) // 4])],
        raw_input_contents=[raw],
    )
    return request.SerializeToString()


def _with_raw_at(remainder: int, raw: bytes, datatype: str = "FP32") -> bytes:
    """A serialized request whose one raw input starts `remainder` bytes past a multiple of 16."""
    for id_length in range(16, 48):
        data = _request(raw, datatype, id_length)
        if (_address(data) + len(data) - len(raw)) % 16 == remainder:
            return data
    raise AssertionError("no id length put the raw input there")


def _array(data: bytes) -> np.ndarray:
    read = parse_infer_request(data)
    (tensor,) = decode_inputs(read.message, read.raw)
    return to_array(tensor, LIMITS)


@pytest.mark.parametrize("remainder", [0, 4, 8, 12])
def test_a_raw_input_is_read_where_it_lies_when_its_address_suits_the_datatype(remainder: int) -> None:
    raw = np.arange(1024, dtype=np.float32).tobytes()
    data = _with_raw_at(remainder, raw)
    read = parse_infer_request(data)
    (got,) = read.raw
    assert bytes(got) == raw
    assert _address(got) == _address(data) + len(data) - len(raw)  # inside the received bytes
    assert read.message.model_name == "mobilenet" and read.message.inputs[0].shape == [256 * 4]
    assert len(read.message.raw_input_contents) == 0
    array = _array(data)
    assert array.tolist() == list(range(1024)) and _address(array) == _address(got)  # no copy


@pytest.mark.parametrize("remainder", [1, 2, 3, 6, 13])
def test_a_raw_input_whose_address_does_not_suit_its_datatype_is_copied_once_aligned(remainder: int) -> None:
    raw = np.arange(1024, dtype=np.float32).tobytes()
    data = _with_raw_at(remainder, raw)
    array = _array(data)
    assert array.tolist() == list(range(1024)) and array.flags.aligned
    assert not _address(data) <= _address(array) < _address(data) + len(data)


def test_a_uint8_input_is_never_copied() -> None:
    raw = bytes(range(256)) * 4
    data = _with_raw_at(7, raw, "UINT8")
    read = parse_infer_request(data)
    (tensor,) = decode_inputs(read.message, read.raw)
    array = to_array(dataclasses.replace(tensor, shape=(1024,)), LIMITS)
    assert bytes(array) == raw and _address(array) == _address(data) + len(data) - len(raw)


def test_a_request_of_very_many_fields_is_read_by_protobuf_with_the_same_result() -> None:
    request = pb.ModelInferRequest(
        model_name="m",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name=f"x{i}", datatype="INT8", shape=[1])
            for i in range(5000)
        ],
        raw_input_contents=[bytes([i % 256]) for i in range(5000)],
    )
    read = parse_infer_request(request.SerializeToString())
    assert [bytes(r) for r in read.raw] == list(request.raw_input_contents)
    assert len(read.message.inputs) == 5000 and not read.message.raw_input_contents


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x3a\xff", b"\x0b"], ids=["cut", "overlong", "group"])
def test_a_malformed_request_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        parse_infer_request(data)


def _as_protobuf_reads(data: bytes) -> tuple[pb.ModelInferRequest, list[bytes]] | None:
    """What protobuf's own parser makes of the bytes: the message less its raw contents, and those;
    None when it refuses them."""
    try:
        message = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return None
    raw = list(message.raw_input_contents)
    message.ClearField("raw_input_contents")
    return message, raw


def _agrees_with_protobuf(data: bytes) -> None:
    expected = _as_protobuf_reads(data)
    try:
        read = parse_infer_request(data)
    except DecodeError:
        assert expected is None, "refused what protobuf reads"
        return
    assert expected is not None, "read what protobuf refuses"
    message, raw = expected
    assert read.message == message
    assert [bytes(r) for r in read.raw] == raw


_VALID = pb.ModelInferRequest(
    model_name="m",
    id="r",
    inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[2])],
    outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="y")],
    raw_input_contents=[bytes(8), b"\x01\x02"],
).SerializeToString()


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_read_as_protobuf_reads_them(data: bytes) -> None:
    _agrees_with_protobuf(data)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(_VALID)), st.integers(0, len(_VALID)), st.binary(max_size=12))
def test_a_request_cut_or_spliced_reads_as_protobuf_reads_it(start: int, end: int, splice: bytes) -> None:
    """Cut anywhere and something put there: lengths that overrun, fields of every wire type."""
    _agrees_with_protobuf(_VALID[:start] + splice + _VALID[max(start, end) :])
