"""The models every server serves: a tiny one (a call's serving cost alone), MobileNetV2 (a real
classifier's compute), and an Identity of MobileNetV2's input (serving a tensor that size, without the
compute: what the servers' code adds to MobileNetV2's ONNX Runtime run); and the batchable
MobileNetV2 of the dynamic-batching measurement."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from demo.models import mobilenet_v2, save_mobilenet_v2
from tests.models import identity_of

MOBILENET_INPUT = (1, 3, 224, 224)


@dataclass(frozen=True)
class BenchModel:
    name: str  # as every server serves it
    label: str
    file: Path
    input: str
    output: str
    shape: tuple[int, ...]

    def job(self) -> dict[str, object]:
        """What a driver's job needs of it."""
        return {"model": self.name, "input": self.input, "output": self.output, "shape": list(self.shape)}


def bench_models(folder: Path) -> list[BenchModel]:
    folder.mkdir(parents=True, exist_ok=True)
    tiny = identity_of(folder / "tiny.onnx", "float32", (1, 4))
    mobilenet = save_mobilenet_v2(folder / "mobilenet_v2.onnx")
    sized = identity_of(folder / "identity_224.onnx", "float32", MOBILENET_INPUT)
    return [
        BenchModel("tiny", "tiny (Identity 1x4 float32)", tiny, "x", "y", (1, 4)),
        BenchModel(
            "mobilenet_v2", "MobileNetV2 1x3x224x224 float32", mobilenet, "input", "prob", MOBILENET_INPUT
        ),
        BenchModel(
            "identity_224",
            "Identity 1x3x224x224 float32 (MobileNetV2's tensor, no compute; 588 KiB each way)",
            sized,
            "x",
            "y",
            MOBILENET_INPUT,
        ),
    ]


def model_named(models: list[BenchModel], name: str) -> BenchModel:
    return next(m for m in models if m.name == name)


def batchable_mobilenet_v2(path: Path) -> Path:
    """MobileNetV2 whose input and output's first axis is any size (Flatten and Gemm keep it), as a
    model with max_batch_size must be."""
    model = mobilenet_v2()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
