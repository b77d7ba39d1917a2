"""accuracy_analysis in the official example's call pattern, read back as that example reads it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rknn_client import RKNN
from rknn_client.accuracy.report import write_values
from tests import models


def test_accuracy_analysis_writes_the_toolkit_layout_read_with_genfromtxt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    for index in range(3):
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(f"cal{index}.jpg")
    Path("dataset.txt").write_text("cal0.jpg\ncal1.jpg\ncal2.jpg\n")
    model = models.small_cnn(tmp_path / "cnn.onnx")

    rknn = RKNN(verbose=True)
    rknn.config(
        mean_values=[123.675, 116.28, 103.53], std_values=[58.82, 58.82, 58.82], target_platform="rk3588"
    )
    assert rknn.load_onnx(model=str(model)) == 0
    assert rknn.build(do_quantization=True, dataset="./dataset.txt") == 0
    assert rknn.accuracy_analysis(inputs=["./cal1.jpg"], output_dir="./snapshot") == 0
    rknn.release()

    mapping = dict(
        line.split() for line in Path("snapshot/map_name_to_file.txt").read_text().splitlines()[2:]
    )
    assert mapping["logits"] == "logits.txt"
    golden = np.genfromtxt("./snapshot/golden/logits.txt")
    simulator = np.genfromtxt("./snapshot/simulator/logits.txt")
    assert golden.shape == simulator.shape == (10,)
    cos = float(golden @ simulator / (np.linalg.norm(golden) * np.linalg.norm(simulator)))
    assert 0.9 < cos < 1.0
    row = next(
        line for line in Path("snapshot/error_analysis.txt").read_text().splitlines() if "] logits" in line
    )
    assert row.split()[2] == f"{cos:.5f}"
    for side in ("golden", "simulator"):
        assert sorted(os.listdir(f"snapshot/{side}/npy")) == sorted(
            name[:-4] + ".npy" for name in os.listdir(f"snapshot/{side}") if name.endswith(".txt")
        )


@pytest.mark.parametrize(
    "value",
    [
        np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32),
        np.arange(-3, 5, dtype=np.int64),
        np.array([], np.float32),
        np.array([True, False]),
        np.float16([1.5, -2.25]),
    ],
)
def test_tensor_text_files_read_back_as_the_toolkits_one_value_per_line(
    value: np.ndarray, tmp_path: Path
) -> None:
    """The fast writer writes the numbers np.savetxt of the flattened tensor writes with the toolkit's
    six decimals (as RKNN-Toolkit2 2.5.0 writes golden/*.txt), without the zeros ending a fraction, and
    genfromtxt reads it back."""
    write_values(tmp_path / "fast.txt", value)
    fmt = "%.6f" if np.issubdtype(value.dtype, np.floating) else "%d"
    np.savetxt(tmp_path / "slow.txt", value.reshape(-1), fmt=fmt)
    slow = (tmp_path / "slow.txt").read_text().splitlines()
    fast = (tmp_path / "fast.txt").read_text().splitlines()
    assert [float(text) for text in fast] == [float(text) for text in slow]
    assert all(
        len(f) <= len(s) and not (f.endswith("0") and "." in f) for f, s in zip(fast, slow, strict=True)
    )
    if value.size:
        read = np.genfromtxt(tmp_path / "fast.txt")
        np.testing.assert_allclose(read, value.reshape(-1).astype(np.float64), rtol=0, atol=5e-7)
