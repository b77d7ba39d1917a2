"""The plain messages and their one conversion module: values computed by hand, round trips."""

from __future__ import annotations

import numpy as np
import pytest

from rknn_proto import convert, messages, rknn_pb2
from rknn_proto.messages import QuantType, TensorAttr, dequantize, quantize


def attr(
    dtype: type, quant: QuantType = QuantType.NONE, zero_point: int = 0, scale: float = 1.0, fl: int = 0
):
    return TensorAttr(0, "t", (4,), np.dtype(dtype), "UNDEFINED", quant, zero_point, scale, fl)


def test_dequantize_gives_the_values_worked_out_by_hand() -> None:
    q = np.array([-128, -3, 0, 127], np.int8)
    affine = dequantize(q, attr(np.int8, QuantType.AFFINE_ASYMMETRIC, zero_point=-3, scale=0.5))
    assert affine.dtype == np.float32
    assert affine.tolist() == [-62.5, 0.0, 1.5, 65.0]
    assert dequantize(q, attr(np.int8, QuantType.DFP, fl=3)).tolist() == [-16.0, -0.375, 0.0, 15.875]
    u = np.array([0, 128, 255], np.uint8)
    assert dequantize(u, attr(np.uint8, QuantType.AFFINE_ASYMMETRIC, 128, 0.25)).tolist() == [
        -32.0,
        0.0,
        31.75,
    ]


def test_dequantize_leaves_real_values_alone() -> None:
    real = np.array([1.5, -2.0], np.float32)
    assert dequantize(real, attr(np.int8, QuantType.AFFINE_ASYMMETRIC, 3, 0.1)) is real
    q = np.array([1, 2], np.int8)
    assert dequantize(q, attr(np.int8)) is q


def test_quantize_rounds_half_to_even_and_saturates() -> None:
    x = np.array([-62.5, 1.5, 100.0, -1000.0, 0.25], np.float32)
    q = quantize(x, attr(np.int8, QuantType.AFFINE_ASYMMETRIC, zero_point=-3, scale=0.5))
    assert q.dtype == np.int8
    assert q.tolist() == [-128, 0, 127, -128, -3]
    assert quantize(np.array([1.0, -0.0625]), attr(np.int8, QuantType.DFP, fl=4)).tolist() == [16, -1]


def test_the_quant_kind_has_the_contracts_names_and_codes() -> None:
    assert convert.QUANT_TYPE_CODES == {
        QuantType.NONE: rknn_pb2.QUANT_TYPE_NONE,
        QuantType.AFFINE_ASYMMETRIC: rknn_pb2.QUANT_TYPE_AFFINE_ASYMMETRIC,
        QuantType.DFP: rknn_pb2.QUANT_TYPE_DFP,
    }
    assert convert.quant_type_from_wire(2) is QuantType.DFP
    assert convert.quant_type_from_wire(99) is QuantType.NONE
    assert QuantType.AFFINE_ASYMMETRIC == "affine"


def test_a_tensor_attr_crosses_the_wire_unchanged() -> None:
    sent = TensorAttr(
        1, "y", (1, 3, -1, 4), np.dtype(np.int8), "NCHW", QuantType.AFFINE_ASYMMETRIC, -3, 0.5, 0
    )
    wire = convert.tensor_attr_to_wire(sent)
    assert (wire.quant_type, wire.layout, wire.size_bytes) == (1, rknn_pb2.LAYOUT_NCHW, 0)
    assert convert.tensor_attr_from_wire(wire) == sent
    fixed = TensorAttr(0, "x", (2, 3), np.dtype(np.float32))
    assert convert.tensor_attr_to_wire(fixed).size_bytes == 24


def test_perf_rows_memory_and_layer_dumps_cross_the_wire_unchanged() -> None:
    row = messages.LayerPerf(
        1, "Conv", "INT8", "NPU", ("(1,3,8,8)",), "(1,8,8,8)", 12.5, "Conv:c1", {"DDRCycles": "7"}
    )
    assert convert.layer_perf_from_wire(convert.layer_perf_to_wire(row)) == row
    memory = messages.EvalMemoryResponse(3000, 1000, 24, 5000, "counted")
    wire = convert.memory_to_wire(memory)
    assert wire.total_memory == 4024
    assert convert.memory_from_wire(wire) == memory
    layer = messages.LayerDump(2, "Relu", "relu1", "r", np.arange(6, dtype=np.float32).reshape(2, 3))
    header = convert.layer_dump_to_wire(layer, layer.array)
    assert (header.tensor.name, list(header.tensor.shape), header.tensor.byte_length) == ("r", [2, 3], 24)
    back = convert.layer_dump_from_wire(header, layer.array)
    assert (back.index, back.op_type, back.node_name, back.tensor_name) == (2, "Relu", "relu1", "r")


@pytest.mark.parametrize(
    ("shape", "fits"), [((1, 3, 8, 8), True), ((2, 3, 8, 8), True), ((1, 3, 8), False), ((1, 4, 8, 8), False)]
)
def test_a_shape_fits_when_every_fixed_dimension_matches(shape: tuple[int, ...], fits: bool) -> None:
    spec = TensorAttr(0, "x", (-1, 3, 8, 8), np.dtype(np.float32), "NCHW")
    assert spec.fits(shape) is fits


def test_a_perf_measurement_crosses_the_wire_with_its_operator_total_computed() -> None:
    rows = (
        messages.LayerPerf(1, "Conv", "INT8", "NPU", (), "(1,8,8,8)", 12.5, "Conv:c1"),
        messages.LayerPerf(2, "Relu", "INT8", "NPU", (), "(1,8,8,8)", 2.25, "Relu:r1"),
    )
    perf = messages.EvalPerfResponse(
        rows,
        total_time_us=20.0,
        total_rw_kb=1.5,
        frequencies=(
            messages.FrequencyList("CPU", (408000, 1800000)),
            messages.FrequencyList("NPU", (1000000000,)),
        ),
        frequencies_fixed=True,
        raw_text="table",
        extra_columns=("DDRCycles",),
    )
    assert perf.total_operator_time_us == 14.75
    wire = convert.perf_to_wire(perf)
    assert wire.total_operator_time_us == 14.75 and [f.kind for f in wire.frequencies] == ["CPU", "NPU"]
    assert convert.perf_from_wire(wire) == perf
