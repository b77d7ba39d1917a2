"""Models built deterministically with the `onnx` package: nothing is downloaded.

`mobilenet_v2()` is the real MobileNetV2 architecture (inverted residual blocks, ReLU6, 3.5 M
parameters, 1x3x224x224 input, 1000-class softmax) with seeded He-initialised weights, batch norm
folded into the convolutions. Its compute and memory are a real classifier's; its classes are not
trained, so its top-5 says nothing about the picture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper.
MOBILENET_V2_BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class GraphBuilder:
    """Appends nodes and seeded weights; names tensors in order so the graph is reproducible."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def weight(self, name: str, array: np.ndarray) -> str:
        self.weights.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, relu6: bool = True
    ) -> str:
        name = self._name("conv")
        fan_in = cin // groups * k * k
        w = self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)
        b = self.rng.standard_normal(cout) * 0.01
        out = f"{name}_out"
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self.weight(f"{name}.weight", w), self.weight(f"{name}.bias", b)],
                [out],
                name=name,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[k // 2] * 4,
                group=groups,
            )
        )
        if not relu6:
            return out
        clip = self._name("relu6")
        lo = self.weight(f"{clip}.min", np.array(0.0))
        hi = self.weight(f"{clip}.max", np.array(6.0))
        self.nodes.append(helper.make_node("Clip", [out, lo, hi], [f"{clip}_out"], name=clip))
        return f"{clip}_out"

    def add(self, a: str, b: str) -> str:
        name = self._name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [f"{name}_out"], name=name))
        return f"{name}_out"

    def op(self, op_type: str, x: str, **attrs: object) -> str:
        name = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, [x], [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def gemm(self, x: str, cin: int, cout: int) -> str:
        name = self._name("fc")
        w = self.rng.standard_normal((cout, cin)) * np.sqrt(1.0 / cin)
        b = np.zeros(cout)
        self.nodes.append(
            helper.make_node(
                "Gemm",
                [x, self.weight(f"{name}.weight", w), self.weight(f"{name}.bias", b)],
                [f"{name}_out"],
                name=name,
                transB=1,
            )
        )
        return f"{name}_out"


def mobilenet_v2(
    num_classes: int = 1000, width: float = 1.0, size: int = 224, seed: int = 0
) -> onnx.ModelProto:
    g = GraphBuilder(seed)

    def ch(c: int) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    x = g.conv("input", 3, ch(32), 3, stride=2)
    cin = ch(32)
    for t, c, n, s in MOBILENET_V2_BLOCKS:
        cout = ch(c)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = g.conv(x, cin, hidden, 1) if t != 1 else x
            y = g.conv(y, hidden, hidden, 3, stride=stride, groups=hidden)
            y = g.conv(y, hidden, cout, 1, relu6=False)
            x = g.add(x, y) if stride == 1 and cin == cout else y
            cin = cout
    last = max(1280, ch(1280))
    x = g.conv(x, cin, last, 1)
    x = g.op("GlobalAveragePool", x)
    x = g.op("Flatten", x, axis=1)
    x = g.gemm(x, last, num_classes)
    out = g.op("Softmax", x, axis=1)
    g.nodes[-1].output[0] = "prob"
    graph = helper.make_graph(
        g.nodes,
        "mobilenet_v2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, num_classes])],
        g.weights,
    )
    del out
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rknn-server-oss demo"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save_mobilenet_v2(path: Path, **kwargs: object) -> Path:
    """Write the model unless an identical file is already there (the bytes are deterministic)."""
    data = mobilenet_v2(**kwargs).SerializeToString()  # type: ignore[arg-type]
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path
