"""A small MobileNetV2-style CNN (Conv/Relu/Clip/depthwise Conv/Add/GlobalAveragePool/Flatten/Gemm/Softmax)
built with onnx.helper from seeded weights, and picture-like test images."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SHAPE = (1, 3, 32, 32)
MEAN = [[123.0, 116.0, 103.0]]
STD = [[58.0, 57.0, 57.0]]


class _Builder:
    """Appends nodes and seeded He-initialised weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []

    def weight(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        data = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.weights.append(numpy_helper.from_array(data, name))
        return name

    def conv(self, x: str, out: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        fan_in = cin // group * k * k
        w = self.weight(f"{out}_w", (cout, cin // group, k, k), (2.0 / fan_in) ** 0.5)
        b = self.weight(f"{out}_b", (cout,), 0.1)
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [out],
                name=f"{out}_node",
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[k // 2] * 4,
                group=group,
            )
        )
        return out

    def op(self, op_type: str, inputs: list[str], out: str, **attrs: int) -> str:
        node = helper.make_node(op_type, inputs, [out], name=f"{out}_node")
        node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
        self.nodes.append(node)
        return out


def build_cnn(seed: int = 0) -> onnx.ModelProto:
    b = _Builder(seed)
    b.weights += [
        numpy_helper.from_array(np.float32(0), "zero"),
        numpy_helper.from_array(np.float32(6), "six"),
    ]
    b.conv("input", "conv1", 3, 16, 3, stride=2)
    b.op("Relu", ["conv1"], "relu1")
    b.conv("relu1", "expand", 16, 32, 1)
    b.op("Clip", ["expand", "zero", "six"], "clip1")
    b.conv("clip1", "dw", 32, 32, 3, group=32)
    b.op("Clip", ["dw", "zero", "six"], "clip2")
    b.conv("clip2", "project", 32, 16, 1)
    b.op("Add", ["project", "relu1"], "add1")
    b.conv("add1", "conv2", 16, 24, 3, stride=2)
    b.op("Relu", ["conv2"], "relu2")
    b.op("GlobalAveragePool", ["relu2"], "gap")
    b.op("Flatten", ["gap"], "flat", axis=1)
    b.op("Gemm", ["flat", b.weight("fc_w", (10, 24), 0.4), b.weight("fc_b", (10,), 0.1)], "logits", transB=1)
    b.op("Softmax", ["logits"], "prob", axis=1)
    graph = helper.make_graph(
        b.nodes,
        "tiny_mobilenet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])],
        b.weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def image_array(seed: int) -> np.ndarray:
    """A smooth-ish random HWC uint8 picture, so activations look like a real image's."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (8, 8, 3))
    picture = np.kron(coarse, np.ones((4, 4, 1))) + rng.normal(0, 12, (32, 32, 3))
    return np.clip(picture, 0, 255).astype(np.uint8)
