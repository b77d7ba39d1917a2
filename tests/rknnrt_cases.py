"""Stand-in boards for the daemon tests: a daemon on the stub librknnrt/librknnmrt over a fake
sysfs tree, a stub model shaped like the host case's image model, and its reference outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rknn_server.testing import DaemonProcess, start_daemon
from tests.rknnrt.stub_build import StubTensor, write_stub_model

# The image model: y = A * x + B per element, stored in an affine int8 output.
A, B = 0.5, -30.0
OUT_ZP, OUT_SCALE = -10, 0.75
IMAGE_NHWC = (1, 16, 16, 3)


def image_model(path: Path) -> Path:
    """A uint8 NHWC image input, like the host case's 1x3x16x16 model, and an int8-quantized output."""
    return write_stub_model(
        path,
        inputs=[StubTensor("image", "UINT8", "NHWC", IMAGE_NHWC)],
        outputs=[StubTensor("score", "INT8", "NHWC", IMAGE_NHWC, OUT_ZP, OUT_SCALE)],
        a=A,
        b=B,
    )


def int8_roundtrip(real: np.ndarray, zero_point: int, scale: float) -> np.ndarray:
    """What an affine int8 tensor holds for `real`, read back as float: the runtime rounds half away
    from zero, saturates to int8, and dequantizes with (q - zp) * scale."""
    v = real.astype(np.float32) / np.float32(scale)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)) + zero_point, -128, 127)
    return ((q - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


def image_reference(inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The image model's outputs for NCHW float inputs, as the runtime computes them (in NHWC)."""
    x = inputs[0].transpose(0, 2, 3, 1).astype(np.float32)
    return [int8_roundtrip(np.float32(A) * x + np.float32(B), OUT_ZP, OUT_SCALE)]


def rknnrt_args(library: Path, board_root: Path, *args: str) -> list[str]:
    """Daemon arguments forcing the rknnrt runtime with `library`, probing the fake board at `board_root`."""
    return ["--runtime", "rknnrt", "--runtime-lib", str(library), "--sysfs-root", str(board_root), *args]


def start_rknnrt_daemon(workdir: Path, library: Path, board_root: Path, *args: str) -> DaemonProcess:
    """A daemon forced onto the rknnrt runtime (see rknnrt_args)."""
    return start_daemon(workdir / "cache", workdir / "daemon.log", rknnrt_args(library, board_root, *args))
