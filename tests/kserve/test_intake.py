"""In-process: the v2 datatype map, the tensor intake's checks, the REST reply's encoding, and the
repository's rules for its folders and config.toml (hostile content gets a clear error, never a
server path)."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import numpy as np
import pytest

from rknn_proto.codec import CodecError, LimitExceeded, TensorLimits
from rknn_server.core.memory import MemoryBudget
from rknn_server.errors import InvalidInput, NotFound
from rknn_server.protocols.kserve import rest
from rknn_server.protocols.kserve.datatypes import JSON_ELEMENT_BYTES, V2_DTYPES, datatype_of, dtype_of
from rknn_server.protocols.kserve.models import InputTensor, OutputTensor, to_array
from rknn_server.protocols.kserve.repository import (
    ModelRepository,
    RepositoryError,
    TensorConfig,
    parse_config,
)
from rknn_server.protocols.kserve.rest import HEADER_LENGTH, JSON_SLICE, infer_reply, parse_json

LIMITS = TensorLimits(max_tensor_bytes=1 << 20, max_rank=4)


def test_every_v2_datatype_maps_both_ways() -> None:
    assert sorted(V2_DTYPES) == sorted(
        ["BOOL", "UINT8", "UINT16", "UINT32", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
    )
    for name, dtype in V2_DTYPES.items():
        assert datatype_of(dtype) == name
    assert datatype_of(np.dtype(">f4")) == "FP32"


@pytest.mark.parametrize(
    ("datatype", "says"), [("BYTES", "string"), ("BF16", "bfloat16"), ("FLOAT", "not a v2 datatype")]
)
def test_unsupported_datatypes_are_refused_clearly(datatype: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says) as caught:
        dtype_of(datatype, "input 'x'")
    assert "FP32" in str(caught.value)  # names the ones that work


def test_raw_contents_must_match_the_shape() -> None:
    data = np.arange(6, dtype=np.float32)
    found = to_array(InputTensor("x", "FP32", (2, 3), raw=data.tobytes()), LIMITS)
    assert found.shape == (2, 3) and found.tobytes() == data.tobytes()
    with pytest.raises(
        InvalidInput, match="28 bytes of raw contents for shape \\[2, 3\\] of FP32; expected 24"
    ):
        to_array(InputTensor("x", "FP32", (2, 3), raw=data.tobytes() + b"\0" * 4), LIMITS)
    with pytest.raises(InvalidInput, match="expected 24"):
        to_array(InputTensor("x", "FP32", (2, 3), raw=b""), LIMITS)


def test_shapes_are_checked_against_the_limits_before_anything_is_allocated() -> None:
    with pytest.raises(CodecError, match="negative"):
        to_array(InputTensor("x", "FP32", (2, -3), raw=b""), LIMITS)
    with pytest.raises(LimitExceeded, match="max_tensor_rank=4"):
        to_array(InputTensor("x", "FP32", (1, 1, 1, 1, 1), raw=b"\0" * 4), LIMITS)
    with pytest.raises(LimitExceeded, match="max_tensor_bytes"):
        to_array(InputTensor("x", "FP32", (1 << 40,), raw=b""), LIMITS)


def test_a_shape_beyond_int64_is_refused_naming_it() -> None:
    for shape in ((10**30,), (2**63,), (2, 2**62), (1, -(2**63) - 1)):
        with pytest.raises(InvalidInput, match=f"shape \\[{', '.join(map(str, shape))}\\] is no tensor"):
            to_array(InputTensor("x", "FP32", shape, raw=b""), LIMITS)
    # Within int64 but over what 8-byte elements can count: still no tensor.
    with pytest.raises(InvalidInput, match="8 per element"):
        to_array(InputTensor("x", "FP64", (2**61,), raw=b""), LIMITS)


def extremes(datatype: str) -> np.ndarray:
    """The values of a datatype whose JSON text is longest."""
    dtype = V2_DTYPES[datatype]
    if dtype.kind == "b":
        return np.array([False, True])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max], dtype)
    finfo = np.finfo(dtype)
    values = [finfo.min, finfo.max, -finfo.tiny, -finfo.smallest_subnormal, -finfo.eps, np.nan, -np.inf]
    return np.array([*values, -0.1234567, -1.2345678e-5], dtype)


def written_data(values: np.ndarray, datatype: str) -> bytes:
    """The text a REST reply writes for `values` as its one JSON output's data, brackets included."""
    reply = infer_reply("m", "", None, [OutputTensor("y", datatype, values.shape, values)], {"": False})
    body = bytes(reply.body)
    start = body.index(b'"data":') + len(b'"data":')
    return body[start : body.index(b"]", start) + 1]


@pytest.mark.parametrize("datatype", sorted(V2_DTYPES))
def test_json_element_bytes_bound_what_the_rest_reply_writes(datatype: str) -> None:
    """The reply rule weighs a JSON reply at these bytes per element before anything is encoded;
    no element the reply writes may take more, or a reply the rule let through could outgrow its
    limit: with NaN and infinities (the standard library writes those slices) and without (orjson
    writes them, in decimals down to 1e-5: -0.000040529070247430354 is its longest)."""
    values = extremes(datatype)
    written = [values]
    if values.dtype.kind == "f":
        longest = np.array([-4.0529070247430354e-05, -1.0000001e-05], values.dtype)
        written.append(np.concatenate([values[np.isfinite(values)], longest]))
    for shown in written:
        data = written_data(shown, datatype)
        assert len(data) - 2 <= shown.size * JSON_ELEMENT_BYTES[datatype] - 1, data


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_a_rest_reply_writes_each_float_as_the_number_it_is(datatype: str, fast: bool) -> None:
    """Finite floats read back as exactly the numbers `tolist` makes of them, whichever library
    wrote the text; a slice holding NaN or an infinity writes them as NaN and Infinity (which
    tritonclient's parser reads), never as orjson's null."""
    dtype = V2_DTYPES[datatype]
    finite = (np.random.default_rng(0).standard_normal(4096) * np.logspace(-7, 4, 4096)).astype(dtype)
    with pytest.MonkeyPatch.context() as patch:
        if not fast:
            patch.setattr(rest, "orjson", None)
        assert json.loads(written_data(finite, datatype)) == finite.tolist()
        odd = np.array([1.5, np.nan, np.inf, -np.inf], dtype)
        assert written_data(odd, datatype) == b"[1.5,NaN,Infinity,-Infinity]"


def test_the_server_extra_writes_rest_json_with_orjson_here() -> None:
    """A REST reply's finite floats are written by orjson (18x the standard library's speed on
    MobileNetV2's input here), which spells 1e-05 in decimals."""
    assert rest.orjson is not None
    assert written_data(np.array([1e-05, 2.5]), "FP64") == b"[0.00001,2.5]"
    assert written_data(np.array([3, -1], np.int64), "INT64") == b"[3,-1]"


# What the REST door must read exactly as the standard library does, whichever parser reads it.
EXACT_JSON = [
    b'{"shape": [1000000000000000000000000000000], "data": [1.5, -0.0, 3]}',  # an integer beyond 64 bits
    b"[18446744073709551615, -9223372036854775808]",
    b"[NaN, Infinity, -Infinity, 1e400]",  # not RFC 8259 JSON, taken as before
    b'{"a": 1, "a": 2, "s": "\\u00e9\\ud800"}',  # a repeated key, a lone surrogate
    b" [0.1234567890123456789, 1e-7] ",
]


@pytest.mark.parametrize("text", EXACT_JSON, ids=range(len(EXACT_JSON)))
@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
def test_rest_json_reads_as_the_standard_library_reads_it(
    text: bytes, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast:
        monkeypatch.setattr(rest, "orjson", None)
    expected, got = json.loads(text), parse_json(memoryview(text))
    assert json.dumps(got) == json.dumps(expected)
    assert [type(v) for v in _leaves(got)] == [type(v) for v in _leaves(expected)]


def _leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@pytest.mark.parametrize("text", [b"", b"[1,]", b"{'a': 1}", b"[1] [2]", b"[" * 100_000 + b"]" * 100_000])
def test_rest_json_refuses_what_is_not_json(text: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)):
        parse_json(text)


def test_the_server_extra_reads_rest_json_with_orjson_here() -> None:
    """orjson is the server extra's on this machine (not armv7l), and plain JSON goes through it."""
    real = rest.orjson
    assert real is not None
    calls: list[object] = []

    class Spy:
        JSONDecodeError = real.JSONDecodeError

        @staticmethod
        def loads(text: bytes | memoryview) -> object:
            calls.append(text)
            return real.loads(text)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rest, "orjson", Spy)
        # tritonclient writes float32s as 20 digits after the point: a fraction, not a long integer
        assert parse_json(b'{"data": [1.5, 2, 0.00026772439014166594]}') == {
            "data": [1.5, 2, 0.00026772439014166594]
        }
        assert parse_json(b"[100000000000000000000]") == [10**20]  # the standard library's
    assert len(calls) == 1


def test_a_rest_reply_is_encoded_in_slices_as_one_body_the_budget_holds() -> None:
    """JSON written a slice at a time reads back as the whole tensor; binary data follows the JSON
    header; the memory budget counts the body while the reply exists."""
    budget = MemoryBudget(0)
    values = np.arange(JSON_SLICE + 3, dtype=np.float32) / 7
    raw = np.arange(6, dtype=np.int16).reshape(2, 3)
    outputs = [OutputTensor("y", "FP32", values.shape, values), OutputTensor("z", "INT16", raw.shape, raw)]
    reply = infer_reply("m", "", "req-1", outputs, {"": False, "z": True}, budget)
    assert budget.used == len(reply.body)
    length = int(dict(reply.headers)[HEADER_LENGTH.title()])
    header = json.loads(reply.body[:length])
    assert header["id"] == "req-1" and header["outputs"][0]["data"] == values.tolist()
    assert header["outputs"][1] == {
        "name": "z",
        "datatype": "INT16",
        "shape": [2, 3],
        "parameters": {"binary_data_size": 12},
    }
    assert reply.body[length:] == raw.tobytes()
    del reply
    gc.collect()
    assert budget.used == 0


def test_typed_contents_must_fit_the_datatype() -> None:
    assert to_array(InputTensor("x", "INT8", (3,), values=[-128, 0, 127]), LIMITS).dtype == np.int8
    assert to_array(InputTensor("x", "BOOL", (2,), values=[True, False]), LIMITS).tolist() == [True, False]
    with pytest.raises(InvalidInput, match="out of range"):
        to_array(InputTensor("x", "INT8", (2,), values=[1, 300]), LIMITS)
    with pytest.raises(InvalidInput, match="out of range"):
        to_array(InputTensor("x", "INT32", (2,), values=[1.5, 2.0]), LIMITS)
    with pytest.raises(InvalidInput, match="2 elements for shape \\[3\\]; expected 3"):
        to_array(InputTensor("x", "FP32", (3,), values=[1.0, 2.0]), LIMITS)
    with pytest.raises(InvalidInput, match="not FP32 values"):
        to_array(InputTensor("x", "FP32", (1,), values=np.asarray(["a"])), LIMITS)


def test_a_config_is_validated() -> None:
    config = parse_config(
        "m", 'file = "a.onnx"\n[[inputs]]\nname = "image"\nlayout = "nhwc"\n[[outputs]]\nname = "p"\n'
    )
    assert config.file == "a.onnx" and config.inputs == (TensorConfig("image", "NHWC"),)
    assert config.outputs == (TensorConfig("p"),)
    bad = {
        "input = []\n": "unknown key\\(s\\) \\['input'\\]; expected file, inputs, outputs",
        '[[inputs]]\nname = "a"\nshape = [1]\n': "unknown key\\(s\\) \\['shape'\\]",
        '[[inputs]]\nlayout = "NCWH"\n': "layout 'NCWH'; expected one of NCHW, NHWC",
        '[[outputs]]\nname = "a"\n[[outputs]]\nname = "a"\n': "repeats a name",
        '[[inputs]]\nname = "a b"\n': "name 'a b' is not allowed",
        "inputs = 3\n": "array of tables",
        'file = "../x.onnx"\n': "plain file name",
        "= broken": "not valid TOML",
    }
    for text, message in bad.items():
        with pytest.raises(RepositoryError, match=message) as caught:
            parse_config("m", text)
        assert "model 'm'" in str(caught.value)


def repository(root: Path) -> ModelRepository:
    return ModelRepository(root, (".onnx",), max_model_bytes=1000)


def test_model_folders_hold_plain_files_only(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "good").mkdir(parents=True)
    (root / "good" / "model.onnx").write_bytes(b"x")
    (root / "linked").mkdir()
    (root / "linked" / "model.onnx").symlink_to("/etc/passwd")
    (root / "nested").mkdir()
    (root / "nested" / "1").mkdir()
    (root / "two").mkdir()
    (root / "two" / "a.onnx").write_bytes(b"x")
    (root / "two" / "b.onnx").write_bytes(b"x")
    (root / "big").mkdir()
    (root / "big" / "model.onnx").write_bytes(b"x" * 1001)
    (root / ("a" * 64)).mkdir()  # would shadow an uploaded model's digest
    os.symlink(root / "good", root / "alias")  # a linked folder is no model
    found = repository(root)
    assert found.names() == ["big", "good", "linked", "nested", "two"]
    assert [(f.version, f.files) for f in found.read("good")] == [("1", ("model.onnx",))]
    for name, message in {
        "linked": "'model.onnx' is a symbolic link",
        "nested": "version 1 has no model.onnx \\(it holds nothing\\)",  # Triton's layout, empty
        "two": "found 2 \\(a.onnx, b.onnx\\)",
        "big": "1001 bytes, over the limit max_model_bytes=1000",
    }.items():
        with pytest.raises(RepositoryError, match=message) as caught:
            found.read(name)
        assert str(root) not in str(caught.value)
    for name in ("alias", "a" * 64, "..", "nothing"):
        with pytest.raises(NotFound):
            found.read(name)
