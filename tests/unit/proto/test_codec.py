"""The wire codec: every dtype round-trips through chunks, and malformed streams are refused."""

from __future__ import annotations

import numpy as np
import pytest

from rknn_proto import codec, rknn_pb2
from rknn_proto.manifest import FileEntry, manifest_digest

LIMITS = codec.TensorLimits(max_tensor_bytes=1 << 24, max_rank=6, max_tensors=4)


@pytest.mark.parametrize("dtype", ["u1", "i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<f2", "<f4", "<f8", "?"])
def test_round_trip_every_dtype_over_several_chunks(dtype: str) -> None:
    rng = np.random.default_rng(0)
    array = (rng.random((3, 1000)) > 0.5) if dtype == "?" else (rng.random((3, 1000)) * 100).astype(dtype)
    wire = codec.wire_array(array)
    chunks = list(codec.iter_chunks([wire], chunk_bytes=777))
    assert len(chunks) == -(-array.nbytes // 777)
    assembler = codec.TensorAssembler([codec.meta_of(wire)], LIMITS)
    for chunk in chunks:
        assembler.add(chunk)
    (out,) = assembler.arrays()
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)


def test_big_endian_and_non_contiguous_arrays_travel_as_little_endian_c_order() -> None:
    array = np.arange(12, dtype=">i4").reshape(3, 4).T
    wire = codec.wire_array(array)
    assert wire.dtype == np.dtype("<i4") and wire.flags.c_contiguous
    np.testing.assert_array_equal(wire, array)


def test_empty_tensor_needs_no_chunk() -> None:
    empty = np.zeros((0, 4), dtype=np.float32)
    assert list(codec.iter_chunks([empty])) == []
    assembler = codec.TensorAssembler([codec.meta_of(empty)], LIMITS)
    assert assembler.arrays()[0].shape == (0, 4)


def test_chunks_of_two_tensors_must_come_in_order() -> None:
    a, b = np.ones(4, dtype=np.float32), np.zeros(4, dtype=np.float32)
    assembler = codec.TensorAssembler([codec.meta_of(a), codec.meta_of(b)], LIMITS)
    with pytest.raises(codec.CodecError, match="out of order"):
        assembler.add(rknn_pb2.TensorChunk(tensor_index=1, offset=0, data=b.tobytes()))


@pytest.mark.parametrize(
    ("shape", "byte_length", "message"),
    [
        ([1, 2, 3, 4, 5, 6, 7], 5040 * 4, "rank 7 exceeds the limit of 6"),
        ([1 << 40], 4 << 40, "over the limit max_tensor_bytes"),
        ([2, -1], 0, "negative dimension"),
        ([2, 3], 25, "does not match shape"),
    ],
)
def test_metas_are_checked_before_allocating(shape: list[int], byte_length: int, message: str) -> None:
    meta = rknn_pb2.TensorMeta(dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=shape, byte_length=byte_length)
    with pytest.raises(codec.CodecError, match=message):
        codec.TensorAssembler([meta], LIMITS)


def test_too_many_tensors_and_unsupported_dtypes() -> None:
    meta = codec.meta_of(np.zeros(1, dtype=np.float32))
    with pytest.raises(codec.CodecError, match="at most 4"):
        codec.TensorAssembler([meta] * 5, LIMITS)
    with pytest.raises(codec.CodecError, match="complex64 cannot travel"):
        codec.meta_of(np.zeros(2, dtype=np.complex64))


def test_manifest_digest_covers_every_file_name_size_and_hash() -> None:
    main = FileEntry("m.onnx", 10, "a" * 64)
    data = FileEntry("w.bin", 20, "b" * 64)
    base = manifest_digest([main, data])
    assert manifest_digest([main, data]) == base
    assert manifest_digest([main, FileEntry("w2.bin", 20, "b" * 64)]) != base
    assert manifest_digest([main, FileEntry("w.bin", 21, "b" * 64)]) != base
    assert manifest_digest([main, FileEntry("w.bin", 20, "c" * 64)]) != base
    assert manifest_digest([data, main]) != base, "the main file is part of the address"
