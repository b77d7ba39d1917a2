"""`rknn-client exec` runs an unmodified toolkit script: `rknn.api` and friends resolve to rknn_client,
and nothing named `rknn` is importable outside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests import models

VENV_BIN = Path(sys.executable).parent
# A conversion script in the official examples' style, unchanged: it imports the toolkit's names only.
SCRIPT = """\
import sys
import numpy as np
from rknn.api import RKNN
from rknn.api.custom_op import get_node_attr
from rknn.utils import onnx_edit
from rknnlite.api import RKNNLite

MODEL, EXPORT = sys.argv[1], sys.argv[2]

if __name__ == '__main__':
    rknn = RKNN(verbose=False)
    rknn.config(mean_values=[0, 0, 0], std_values=[255, 255, 255], target_platform='rk3588')
    ret = rknn.load_onnx(model=MODEL)
    if ret != 0:
        print('Load model failed!')
        exit(ret)
    ret = rknn.build(do_quantization=True, dataset='./dataset.txt')
    if ret != 0:
        print('Build model failed!')
        exit(ret)
    ret = rknn.export_rknn(EXPORT)
    if ret != 0:
        print('Export rknn model failed!')
        exit(ret)
    ret = rknn.init_runtime()
    if ret != 0:
        exit(ret)
    img = np.zeros((16, 16, 3), np.uint8)
    outputs = rknn.inference(inputs=[img])
    print('outputs', outputs[0].shape, type(rknn).__module__)
    rknn.release()
"""


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ""}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("how", ["cli", "module"])
def test_exec_runs_an_unmodified_toolkit_script_to_the_end(tmp_path: Path, how: str) -> None:
    (tmp_path / "convert.py").write_text(SCRIPT)
    for index, size in enumerate((16, 30)):
        Image.fromarray(np.full((size, size, 3), 40 * index + 20, np.uint8)).save(tmp_path / f"c{index}.jpg")
    (tmp_path / "dataset.txt").write_text("c0.jpg\nc1.jpg\n")
    model = models.small_cnn(tmp_path / "cnn.onnx")
    exported = tmp_path / "cnn.rknn"
    head = (
        [str(VENV_BIN / "rknn-client"), "exec"]
        if how == "cli"
        else [sys.executable, "-m", "rknn_client.exec"]
    )
    result = run([*head, "convert.py", str(model), str(exported)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "outputs (1, 10) rknn_client.compat.rknn" in result.stdout
    assert exported.is_file()
    assert "W build: " in result.stdout and "to the model input's 16x16" in result.stdout
    assert "WARNING:root" not in result.stdout + result.stderr


def test_the_exit_status_is_the_scripts(tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text("from rknn.api import RKNN\nexit(RKNN().load_onnx('missing.onnx'))\n")
    result = run([sys.executable, "-m", "rknn_client.exec", "fails.py"], tmp_path)
    assert result.returncode == 255
    assert "E load_onnx: model file missing.onnx does not exist" in result.stderr


def test_nothing_named_rknn_is_installed(tmp_path: Path) -> None:
    result = run([sys.executable, "-c", "import rknn"], tmp_path)
    assert result.returncode != 0 and "No module named 'rknn'" in result.stderr
