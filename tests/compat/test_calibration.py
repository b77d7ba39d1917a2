"""Calibration images as the toolkit reads them: OpenCV's resize for other sizes, BGR on request,
a corrupt file named in build()'s -1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rknn_client import RKNN
from rknn_client.accuracy.preprocess import InputSpec, load_input
from rknn_client.input_files import resize_linear
from tests import models


def test_resize_maps_pixels_as_opencv_inter_linear() -> None:
    # Values cv2.resize(INTER_LINEAR) gives: centres aligned, borders clamped, no antialiasing.
    row = np.array([[0, 100]], np.uint8)[:, :, None]
    assert resize_linear(row, 1, 4)[0, :, 0].tolist() == [0, 25, 75, 100]
    step = np.array([[0, 0, 100, 100]], np.uint8)[:, :, None]
    assert resize_linear(step, 1, 2)[0, :, 0].tolist() == [0, 100]


def write_dataset(folder: Path, sizes: list[tuple[int, int]], corrupt: str | None = None) -> Path:
    rng = np.random.default_rng(5)
    names = []
    for index, (w, h) in enumerate(sizes):
        name = f"img{index}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / name)
        names.append(name)
    if corrupt:
        (folder / corrupt).write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
        names.append(corrupt)
    listing = folder / "dataset.txt"
    listing.write_text("\n".join(names) + "\n")
    return listing


def test_a_mixed_size_dataset_is_resized_with_a_warning_in_the_toolkit_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_dataset(tmp_path, [(16, 16), (40, 30), (9, 21)])
    rknn = RKNN()
    assert rknn.config(mean_values=[0, 0, 0], std_values=[255, 255, 255]) == 0
    assert rknn.load_onnx(str(models.small_cnn(tmp_path / "cnn.onnx"))) == 0
    assert rknn.build(do_quantization=True, dataset=str(dataset)) == 0
    rknn.release()
    said = capsys.readouterr()
    text = said.out + said.err
    resized = [line for line in text.splitlines() if "to the model input's 16x16" in line]
    assert len(resized) == 2 and all(line.startswith("W build: ") for line in resized)
    assert "img1.png: resized from 40x30" in text and "img2.png: resized from 9x21" in text
    assert "WARNING:root" not in text


def test_a_corrupt_image_fails_build_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_dataset(tmp_path, [(16, 16), (20, 20)], corrupt="broken.jpg")
    rknn = RKNN()
    assert rknn.load_onnx(str(models.small_cnn(tmp_path / "cnn.onnx"))) == 0
    assert rknn.build(do_quantization=True, dataset=str(dataset)) == -1
    rknn.release()
    err = capsys.readouterr().err
    assert err.startswith("E build: ") and f"cannot read image {tmp_path / 'broken.jpg'}" in err


def test_quant_img_rgb2bgr_swaps_the_channels(tmp_path: Path) -> None:
    pixel = np.array([[[10, 20, 30]]], np.uint8)
    Image.fromarray(pixel).save(tmp_path / "p.png")
    spec = InputSpec("x", (1, 3, 1, 1), np.dtype(np.float32))
    assert load_input(tmp_path / "p.png", spec).ravel().tolist() == [10, 20, 30]
    assert load_input(tmp_path / "p.png", spec, rgb2bgr=True).ravel().tolist() == [30, 20, 10]


def test_a_float64_npy_dataset_calibrates_a_float32_input(tmp_path: Path) -> None:
    """The official multi_input example writes its calibration arrays with np.save's default float64."""
    model = models.small_cnn(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(2).standard_normal((1, 3, 16, 16)))  # float64
    (tmp_path / "dataset.txt").write_text("x.npy\n")
    spec = InputSpec("input", (1, 3, 16, 16), np.dtype(np.float32))
    assert load_input(tmp_path / "x.npy", spec).dtype == np.float32
    rknn = RKNN(toolkit="host")
    assert rknn.config(target_platform="rk3588") == 0 and rknn.load_onnx(str(model)) == 0
    assert rknn.build(do_quantization=True, dataset=str(tmp_path / "dataset.txt")) == 0
    rknn.release()
