"""The stand-in model every board test runs, and its outputs computed independently of the runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.rknnrt.stub_build import StubTensor, write_stub_model

SHAPE = (1, 8, 8, 3)
ZP, SCALE = 5, 0.25
A, B = 1.5, -20.0
WEIGHT, INTERNAL, PERF_US = 4096, 2048, 7


def stub_model(path: Path) -> Path:
    """y = A*x + B of a uint8 image into an affine int8 output (the stub's format: stub_build.py)."""
    return write_stub_model(
        path,
        inputs=[StubTensor("image", "UINT8", "NHWC", SHAPE)],
        outputs=[StubTensor("score", "INT8", "NHWC", SHAPE, ZP, SCALE)],
        a=A,
        b=B,
        weight=WEIGHT,
        internal=INTERNAL,
        perf_us=PERF_US,
    )


def expected(image: np.ndarray) -> np.ndarray:
    """A*x + B, rounded half away from zero to int8 at SCALE/ZP, saturated, read back as float."""
    v = (np.float32(A) * image.astype(np.float32) + np.float32(B)) / np.float32(SCALE)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)) + ZP, -128, 127)
    return ((q - np.float32(ZP)) * np.float32(SCALE)).astype(np.float32)


def an_image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, SHAPE, dtype=np.uint8)
