"""A small MobileNetV2-style CNN (Conv/Relu/Clip/depthwise Conv/Add/GlobalAveragePool/Flatten/Gemm/Softmax)
built with onnx.helper from seeded weights, its calibration data, and its int8 QDQ build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from rknn_client.accuracy.preprocess import bake_normalization
from rknn_client.accuracy.quantize import quantize_model

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

    def op(self, op_type: str, inputs: list[str], out: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{out}_node", **attrs))
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


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("accuracy")


@pytest.fixture(scope="session")
def float_model(workdir: Path) -> Path:
    """The CNN with the toolkit's mean/std baked in: its input is the raw NCHW image."""
    path = workdir / "float.onnx"
    onnx.save(bake_normalization(build_cnn(), MEAN, STD), path)
    return path


@pytest.fixture(scope="session")
def dataset(workdir: Path) -> Path:
    """dataset.txt with PNG images and one .npy, paths relative to the txt's folder."""
    folder = workdir / "data"
    folder.mkdir()
    lines = []
    for seed in range(6):
        Image.fromarray(image_array(seed)).save(folder / f"img{seed}.png")
        lines.append(f"img{seed}.png")
    np.save(folder / "extra.npy", image_array(99).transpose(2, 0, 1)[np.newaxis].astype(np.float32))
    lines.append("extra.npy")
    (folder / "dataset.txt").write_text("\n".join(lines) + "\n")
    return folder / "dataset.txt"


@pytest.fixture(scope="session")
def test_image(workdir: Path) -> Path:
    path = workdir / "probe.png"
    Image.fromarray(image_array(1234)).save(path)
    return path


@pytest.fixture(scope="session")
def quant_model(workdir: Path, float_model: Path, dataset: Path) -> Path:
    path = workdir / "quant_normal.onnx"
    quantize_model(float_model, path, dataset, "normal", "channel")
    return path
