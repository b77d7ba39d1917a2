"""Image inputs: with OpenCV installed (the client extra) the pixels are exactly what a toolkit script
gets from cv2.imread + cvtColor(BGR2RGB) + cv2.resize; without it Pillow and resize_linear stand in."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rknn_client.input_files import read_image, resize_linear

PHOTO = Path(__file__).resolve().parents[3] / "demo" / "assets" / "grace_hopper.jpg"


def _noise_png(path: Path) -> Path:
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize("size", [(16, 16, 3), (224, 224, 3), (50, 40, 1)])
def test_opencv_reads_and_resizes_the_way_toolkit_scripts_do(size: tuple[int, int, int]) -> None:
    cv2 = pytest.importorskip("cv2", reason="OpenCV comes with the client extra (make install)")
    notes: list[str] = []
    got = read_image(PHOTO, size, notes.append)
    if size[2] == 3:
        want = cv2.cvtColor(cv2.imread(str(PHOTO)), cv2.COLOR_BGR2RGB)
    else:
        want = cv2.imread(str(PHOTO), cv2.IMREAD_GRAYSCALE)
    want = cv2.resize(want, (size[1], size[0]), interpolation=cv2.INTER_LINEAR).reshape(size)
    assert got.dtype == np.uint8 and got.shape == size
    np.testing.assert_array_equal(got, want)
    assert notes and "resized from 512x600" in notes[0]


def test_without_opencv_pillow_decodes_and_resize_linear_resizes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 raises ImportError
    png = _noise_png(tmp_path / "noise.png")
    got = read_image(png, (16, 20, 3), lambda _: None)
    with Image.open(png) as image:
        np.testing.assert_array_equal(got, resize_linear(np.asarray(image), 16, 20))
