"""accuracy_analysis in the official example's call pattern, read back as that example reads it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rknn_client import RKNN
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
