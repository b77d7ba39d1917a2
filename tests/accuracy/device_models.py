"""The demo's MobileNetV2 at a small width and size, and a calibration set cut from the demo photo."""

from __future__ import annotations

from pathlib import Path

import onnx

from demo.calibration import photo_crops, write_dataset
from demo.models import mobilenet_v2

SIZE = 64
MEAN = [[123.675, 116.28, 103.53]]
STD = [[58.395, 57.12, 57.375]]
PHOTO = Path(__file__).resolve().parents[2] / "demo" / "assets" / "grace_hopper.jpg"


def small_mobilenet(path: Path) -> Path:
    onnx.save(mobilenet_v2(num_classes=100, width=0.35, size=SIZE), path)
    return path


def calibration_set(folder: Path, count: int = 4) -> Path:
    """dataset.txt of `count` crops of the demo photo at the model's input size."""
    return write_dataset(folder, photo_crops(PHOTO, folder, count, SIZE))
