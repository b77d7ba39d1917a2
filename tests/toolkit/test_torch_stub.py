"""The --torch-stub toolkit: the official onnx_edit example runs in it unchanged (the toolkit's own
rknn.utils.onnx_edit, then a quantized build of the edited model), and installing it says which
features need real PyTorch instead of leaving users to meet an AttributeError on torch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rknn_client.toolkit import Toolkit
from rknn_client.toolkit.install import install
from rknn_client.toolkit.locate import ENV_PYTHON, STAMP, managed_dir
from tests.models import concat_block

# examples/functions/onnx_edit/test.py of RKNN-Toolkit2 2.5.0, run as is in the toolkit's interpreter.
OFFICIAL_FLOW = """
from rknn.api import RKNN
from rknn.utils import onnx_edit
ret = onnx_edit(model='./concat_block.onnx', export_path='./concat_block_edited.onnx',
                inputs_transform={'k_cache.1': 'a,b,c,d->1,ad,b,c'},
                outputs_transform={'k_cache': 'a,b,c,d->1,ab,c,d'}, dataset='./dataset.txt')
assert ret == 0, ret
rknn = RKNN(verbose=True)
assert rknn.config(target_platform='rk3588') == 0
assert rknn.load_onnx('./concat_block_edited.onnx') == 0
assert rknn.build(do_quantization=True, dataset='./dataset_for_concat_block_edited.txt') == 0
assert rknn.export_rknn('./concat_block_edited.rknn') == 0
rknn.release()
"""


def test_the_official_onnx_edit_flow_builds_with_the_toolkits_own_onnx_edit(
    toolkit: Toolkit, tmp_path: Path
) -> None:
    # The example's two-input block: its Reshape-Concat-Reshape makes build's graph rule compute an
    # index map with torch.arange/split/cat (the stand-in's numpy ones).
    concat_block(tmp_path / "concat_block.onnx")
    rng = np.random.default_rng(1)
    np.save(tmp_path / "f.npy", rng.standard_normal((1, 1, 48, 63)).astype(np.float32))
    np.save(tmp_path / "k.npy", rng.standard_normal((4, 48, 1, 8)).astype(np.float32))
    (tmp_path / "dataset.txt").write_text("f.npy k.npy\n")
    done = subprocess.run(
        [str(toolkit.python), "-c", OFFICIAL_FLOW], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (toolkit.torch, done.stderr[-3000:])
    assert "torch" not in done.stderr.lower(), done.stderr[-3000:]
    assert (tmp_path / "concat_block_edited.rknn").read_bytes()[:4] == b"RKNN"


def test_installing_with_the_stand_in_says_what_needs_real_pytorch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    venv = managed_dir("2.5.0", torch_stub=True)
    venv.mkdir(parents=True)
    (venv / STAMP).write_text(json.dumps({"version": "2.5.0", "torch": "stub"}))
    said: list[str] = []
    assert install("2.5.0", torch_stub=True, say=said.append) == venv
    (limits,) = [line for line in said if "load_pytorch" in line]
    assert "needs real PyTorch" in limits and "without --torch-stub" in limits
    assert "rknn.utils.onnx_edit" in limits and "build (with quantization)" in limits
