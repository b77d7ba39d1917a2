"""Fixtures of the throughput tests: small versions of the benchmark models, and their inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.throughput import models

SIZE = 64


@pytest.fixture(scope="session")
def camera_model(models_dir: Path) -> Path:
    return models.camera_cnn(models_dir / "camera_cnn.onnx", size=SIZE)


@pytest.fixture(scope="session")
def qdq_detector(models_dir: Path) -> Path:
    float_model = models.detector(models_dir / "detector.onnx", size=SIZE)
    return models.quantized(float_model, models_dir / "detector_qdq.onnx", models.random_images(4, SIZE))


@pytest.fixture(scope="session")
def images() -> list[np.ndarray]:
    return models.random_images(12, SIZE, seed=7)
