"""The shared varint writer and reader agree with protobuf's own encoding."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from rknn_proto import rknn_pb2
from rknn_proto.wire import LENGTH_DELIMITED, VARINT, read_varint, tag, varint


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
