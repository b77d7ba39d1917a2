"""The shared varint writer and reader agree with protobuf's own encoding; split_field reads a
message as protobuf does, one field's values left where they lie; with_bytes_fields writes what
protobuf would."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from rknn_proto import rknn_pb2
from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.wire import (
    LENGTH_DELIMITED,
    VARINT,
    Unusual,
    read_varint,
    split_field,
    tag,
    varint,
    with_bytes_fields,
)


@pytest.mark.parametrize("value", [1, 127, 128, 300, 2**32 - 1, 2**63, 2**64 - 1])
def test_a_varint_is_written_as_protobuf_writes_it_and_read_back(value: int) -> None:
    wire = rknn_pb2.UploadChunk(offset=value).SerializeToString()
    assert wire == tag(rknn_pb2.UploadChunk.OFFSET_FIELD_NUMBER, VARINT) + varint(value)
    assert read_varint(wire, len(tag(rknn_pb2.UploadChunk.OFFSET_FIELD_NUMBER, VARINT))) == (value, len(wire))


def test_a_length_delimited_tag_is_protobufs() -> None:
    wire = rknn_pb2.UploadChunk(data=b"xyz").SerializeToString()
    assert wire == tag(rknn_pb2.UploadChunk.DATA_FIELD_NUMBER, LENGTH_DELIMITED) + varint(3) + b"xyz"


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff" * 10 + b"\x01"])
def test_a_truncated_or_overlong_varint_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        read_varint(data, 0)


RAW = pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER


def _request() -> pb.ModelInferRequest:
    """Every kind of field: strings, a map, repeated messages, raw contents (one empty), an int64."""
    request = pb.ModelInferRequest(
        model_name="m",
        model_version="2",
        id="req",
        inputs=[pb.ModelInferRequest.InferInputTensor(name=n, datatype="FP32", shape=[1, 2]) for n in "abc"],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="y")],
        raw_input_contents=[bytes(range(8)), b"", b"\xff" * 300],
    )
    request.parameters["sequence_id"].int64_param = -5
    request.inputs[0].parameters["binary_data_size"].int64_param = 8
    return request


def test_split_field_gives_the_values_in_order_as_views_and_the_rest_as_protobuf_reads_it() -> None:
    request = _request()
    data = request.SerializeToString()
    rest, values = split_field(data, RAW, 100)
    assert [bytes(v) for v in values] == list(request.raw_input_contents)
    assert all(v.obj is data for v in values)  # views of the message: nothing copied
    without = pb.ModelInferRequest()
    without.CopyFrom(request)
    without.ClearField("raw_input_contents")
    assert pb.ModelInferRequest.FromString(rest) == without


def test_split_field_keeps_fields_interleaved_with_the_values_and_a_wrong_wire_type_as_protobuf() -> None:
    """Senders may write fields in any order; field 7 as a varint is no raw content (protobuf keeps
    it as an unknown field, and so does the rest)."""
    first, second = pb.ModelInferRequest(raw_input_contents=[b"one"]), pb.ModelInferRequest(id="x")
    oddity = tag(RAW, VARINT) + varint(9)
    data = first.SerializeToString() + second.SerializeToString() + oddity + first.SerializeToString()
    rest, values = split_field(data, RAW, 100)
    assert [bytes(v) for v in values] == [b"one", b"one"]
    assert rest == second.SerializeToString() + oddity
    assert pb.ModelInferRequest.FromString(rest).id == "x"


@pytest.mark.parametrize("cut", [1, 5, -1])
def test_split_field_of_a_message_cut_short_is_a_decode_error(cut: int) -> None:
    data = _request().SerializeToString()
    with pytest.raises(DecodeError):
        split_field(data[:cut], RAW, 100)


def test_split_field_leaves_groups_and_too_many_fields_to_protobuf() -> None:
    with pytest.raises(Unusual):
        split_field(tag(1, 3) + tag(1, 4), RAW, 100)  # a start-group and end-group key
    many = pb.ModelInferRequest(raw_input_contents=[b"x"] * 11).SerializeToString()
    with pytest.raises(Unusual):
        split_field(many, RAW, 10)


def test_with_bytes_fields_writes_the_bytes_protobuf_would() -> None:
    outputs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(0, np.int8), np.array([True, False])]
    head = pb.ModelInferResponse(
        model_name="m", id="r", outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", shape=[2, 3])]
    )
    raw = [a.reshape(-1).view(np.uint8).data for a in outputs]
    data = with_bytes_fields(
        head.SerializeToString(), pb.ModelInferResponse.RAW_OUTPUT_CONTENTS_FIELD_NUMBER, raw
    )
    whole = pb.ModelInferResponse()
    whole.CopyFrom(head)
    whole.raw_output_contents.extend(a.tobytes() for a in outputs)
    assert data == whole.SerializeToString()
    assert pb.ModelInferResponse.FromString(data) == whole
