"""The upload's request stream, framed by the client itself: the bytes protobuf would write, the
chunk size a daemon's limits allow, and only the bytes from the held offsets on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rknn_client.upload_stream import (
    PREFIX_ROOM,
    UPLOAD_CHUNK_BYTES,
    chunk_prefix,
    upload_chunk_bytes,
    upload_requests,
)
from rknn_proto import rknn_pb2
from rknn_proto.version import CHUNK_BYTES


@pytest.mark.parametrize(
    ("file_index", "offset", "size"),
    [(0, 0, 1), (1, 0, 5), (0, 1, 127), (3, 127, 128), (2**32 - 1, 2**64 - 1, 300), (7, 1 << 33, 1 << 20)],
)
def test_a_chunk_request_is_the_bytes_protobuf_writes(file_index: int, offset: int, size: int) -> None:
    data = os.urandom(size)
    expected = rknn_pb2.UploadModelRequest(
        chunk=rknn_pb2.UploadChunk(file_index=file_index, offset=offset, data=data)
    ).SerializeToString()
    prefix = chunk_prefix(file_index, offset, size)
    assert prefix + data == expected and len(prefix) <= PREFIX_ROOM


def test_the_chunk_size_follows_the_daemons_limits() -> None:
    assert (
        upload_chunk_bytes({"max_chunk_bytes": 64 << 20, "max_message_bytes": 64 << 20}) == UPLOAD_CHUNK_BYTES
    )
    assert upload_chunk_bytes({"max_chunk_bytes": 300_000, "max_message_bytes": 8 << 20}) == 300_000
    small_messages = upload_chunk_bytes({"max_chunk_bytes": 8 << 20, "max_message_bytes": 2 << 20})
    assert small_messages < 2 << 20
    framing = chunk_prefix(2**32 - 1, 2**64 - 1, small_messages)
    assert len(framing) + small_messages <= 2 << 20  # the whole message fits the daemon's message limit
    assert upload_chunk_bytes({}) == CHUNK_BYTES  # a daemon that does not say: the protocol's chunk


def test_the_stream_sends_each_file_from_its_held_offset_in_order(tmp_path: Path) -> None:
    main, weights = tmp_path / "m.onnx", tmp_path / "w.bin"
    main.write_bytes(os.urandom(1000))
    weights.write_bytes(os.urandom(2500))
    header = rknn_pb2.UploadHeader(start_offsets=[1000, 700])  # the main file is held whole
    sizes: list[int] = []
    messages = [
        rknn_pb2.UploadModelRequest.FromString(m)
        for m in upload_requests(header, [main, weights], 1024, sizes.append)
    ]
    assert messages[0].header == header
    chunks = [m.chunk for m in messages[1:]]
    assert [(c.file_index, c.offset, len(c.data)) for c in chunks] == [(1, 700, 1024), (1, 1724, 776)]
    assert b"".join(c.data for c in chunks) == weights.read_bytes()[700:]
    assert sizes == [1024, 776]
