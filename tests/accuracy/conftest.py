"""Session-wide fixtures: the tiny CNN with mean/std baked in, its calibration data and its int8 QDQ build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from accuracy_cnn import MEAN, STD, build_cnn, image_array
from PIL import Image

from rknn_client.accuracy.preprocess import bake_normalization
from rknn_client.accuracy.quantize import quantize_model


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
