"""Small real ONNX models for the tests, built with onnx.helper and seeded weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def onnx_model(graph: onnx.GraphProto, *domains: onnx.OperatorSetIdProto) -> onnx.ModelProto:
    """`graph` as a model at opset 17, IR 8 (what ONNX Runtime here loads), plus any custom `domains`;
    unchecked, so hostile and custom-op models can be built with it too."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), *domains])
    model.ir_version = 8
    return model


def save_graph(graph: onnx.GraphProto, path: Path) -> Path:
    """A checked model of `graph` (see `onnx_model`), saved to `path`."""
    model = onnx_model(graph)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def small_cnn(path: Path, seed: int = 0, channels: int = 3, size: int = 16) -> Path:
    """Conv -> Relu -> Conv -> Add(skip) -> GlobalAveragePool -> Flatten -> Gemm: a classifier in miniature."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((8, channels, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    fc = rng.standard_normal((10, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["a1"], name="add1"),
        helper.make_node("GlobalAveragePool", ["a1"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (fc, "fc"))],
    )
    return save_graph(graph, path)


# Element types the wire carries, with the ONNX type of each.
DTYPES = {
    "uint8": TensorProto.UINT8,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "float16": TensorProto.FLOAT16,
    "float32": TensorProto.FLOAT,
    "bool": TensorProto.BOOL,
}


def identity_of(path: Path, dtype: str, shape: tuple[int, ...] = (2, 3)) -> Path:
    """y = Identity(x) for one dtype: checks bytes survive the wire exactly."""
    elem = DTYPES[dtype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        f"identity_{dtype}",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, list(shape))],
    )
    return save_graph(graph, path)


def two_inputs(path: Path) -> Path:
    """y = a * 2 + b with an int64 second output (count of a), for multi-input and int64 rules."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["a", "two"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["y"]),
            helper.make_node("Shape", ["a"], ["shape"]),
        ],
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    return save_graph(graph, path)


def big_identity(path: Path, elements: int) -> Path:
    """A float32 identity of `elements` values, for multi-chunk tensors."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "big_identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, elements])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, elements])],
    )
    return save_graph(graph, path)


def expand(path: Path, elements: int) -> Path:
    """y = Expand(x, [elements]): a 4-byte input, a static float32 output of `elements` values (a large
    reply whose size the model declares, for a small request)."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [elements])
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])],
        "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])],
        [shape],
    )
    return save_graph(graph, path)


def constant_of_shape_bomb(path: Path, elements: int) -> Path:
    """A model of a few hundred bytes whose constant folding makes `elements` float32 values at load:
    y = ConstantOfShape([elements]) + x."""
    shape = numpy_helper.from_array(np.array([elements], np.int64), "shape")
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["shape"], value=shape),
            helper.make_node("ConstantOfShape", ["shape"], ["big"], value=one),
            helper.make_node("Add", ["big", "x"], ["y"]),
        ],
        "constant_of_shape_bomb",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])],
    )
    return save_graph(graph, path)


def shape_input_bomb(path: Path) -> Path:
    """y = ConstantOfShape(shape): the caller's int64 input decides how much a run allocates."""
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], value=one)],
        "shape_input_bomb",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    return save_graph(graph, path)


def external_data_model(folder: Path) -> Path:
    """A model whose weight lives in a separate file (ONNX external data)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    path = folder / "external.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="external.weights", size_threshold=0)
    return path


def concat_block(path: Path, seed: int = 0) -> Path:
    """The shape of RKNN-Toolkit2's onnx_edit example: feature_0 [1, 1, 48, 63] -> Conv(32, 1x1) ->
    Sigmoid -> Reshape [4, 8, 48, 63], concatenated after k_cache.1 [4, 48, 1, 8] transposed to
    [4, 8, 48, 1]; k_cache is the concat's first column, feature_1 the concat reshaped to
    [1, 32, 48, 64]. The Reshape-Concat-Reshape is what the toolkit's graph rules rewrite."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((32, 1, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)

    def ints(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [
        helper.make_node("Conv", ["feature_0", "w", "b"], ["conv"], kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["conv"], ["sig"]),
        helper.make_node("Reshape", ["sig", "shape_a"], ["reshaped"]),
        helper.make_node("Transpose", ["k_cache.1"], ["kt"], perm=[0, 3, 1, 2]),
        helper.make_node("Concat", ["kt", "reshaped"], ["joined"], axis=3),
        helper.make_node("Slice", ["joined", "starts", "ends", "axes"], ["k_cache"]),
        helper.make_node("Reshape", ["joined", "shape_b"], ["feature_1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "concat_block",
        [
            helper.make_tensor_value_info("feature_0", TensorProto.FLOAT, [1, 1, 48, 63]),
            helper.make_tensor_value_info("k_cache.1", TensorProto.FLOAT, [4, 48, 1, 8]),
        ],
        [
            helper.make_tensor_value_info("feature_1", TensorProto.FLOAT, [1, 32, 48, 64]),
            helper.make_tensor_value_info("k_cache", TensorProto.FLOAT, [4, 8, 48, 1]),
        ],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(bias, "b"),
            ints("shape_a", [4, 8, 48, 63]),
            ints("shape_b", [1, 32, 48, 64]),
            ints("starts", [-1]),
            ints("ends", [2**63 - 1]),
            ints("axes", [3]),
        ],
    )
    return save_graph(graph, path)
