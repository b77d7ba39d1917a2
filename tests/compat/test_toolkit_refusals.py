"""What RKNN-Toolkit2 refuses, the compat layer refuses too, whichever path a script takes: a config()
without target_platform (the script stops there), op_target keys that name no tensor, a model built for
another SoC; and the loaders only the toolkit has say how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from rknn_client import RKNN
from rknn_client.compat.toolkit_route import ENV_TOOLKIT
from rknn_client.toolkit.locate import ENV_PYTHON
from rknn_server.testing import DaemonProcess
from tests import models
from tests.conftest import DaemonFactory


def test_config_without_target_platform_stops_the_script_on_the_auto_path_without_a_toolkit(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """As the toolkit's config() raises ValueError: auto mode stops at the same line whether a toolkit
    is installed or not, with one message naming what to set (not a cascade of -1s)."""
    monkeypatch.setenv(ENV_TOOLKIT, "auto")
    monkeypatch.setenv(ENV_PYTHON, "/nowhere/python")  # no toolkit: the host path
    rknn = RKNN()
    try:
        with pytest.raises(ValueError, match="'target_platform' has not been set yet") as raised:
            rknn.config(mean_values=[[0, 0, 0]], std_values=[[1, 1, 1]])
        assert "rk3588" in str(raised.value) and "target_platform=" in str(raised.value)
        assert rknn._route.bridge is None  # refused before any toolkit was looked for
        assert capfd.readouterr().err.count("E config:") == 1
        assert rknn.config(mean_values=[[0, 0, 0]], std_values=[[1, 1, 1]], target_platform="rk3588") == 0
    finally:
        rknn.release()


def test_the_forced_host_path_runs_without_target_platform() -> None:
    """toolkit='host' never uses the toolkit (virtual boards only): no platform is needed there."""
    rknn = RKNN(toolkit="host")
    assert rknn.config(mean_values=[[0, 0, 0]], std_values=[[1, 1, 1]]) == 0
    rknn.release()


def test_op_target_keys_must_name_tensors_of_the_model(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The toolkit's build() refuses an op_target key that no node writes ('Invalid key of ... in
    op_target'), node names included; a tensor name is accepted."""
    model = models.small_cnn(tmp_path / "cnn.onnx")
    graph = onnx.load(model).graph
    written = [name for node in graph.node for name in node.output]
    node_name = next(node.name for node in graph.node if node.name and node.name not in written)
    for key, expected in (("no_such_tensor", -1), (node_name, -1), (written[-1], 0)):
        rknn = RKNN(toolkit="host")
        try:
            assert rknn.config(target_platform="rk3588", op_target={key: "cpu"}) == 0
            assert rknn.load_onnx(str(model)) == 0
            assert rknn.build(do_quantization=False) == expected, key
        finally:
            rknn.release()
        err = capfd.readouterr().err
        if expected == -1:
            assert f"E build: Invalid key of '{key}' in 'op_target'!" in err
            assert "output tensor name" in err
        else:
            assert "op_target" not in err


@pytest.mark.parametrize("loader", ["load_caffe", "load_tensorflow"])
def test_the_toolkits_own_loaders_name_the_install_on_the_host_path(
    loader: str, capfd: pytest.CaptureFixture[str]
) -> None:
    rknn = RKNN(toolkit="host")
    assert getattr(rknn, loader)("model.prototxt") == -1
    rknn.release()
    err = capfd.readouterr().err
    assert err.startswith(f"E {loader}: ") and "rknn-client toolkit install" in err and "load_onnx()" in err


def test_a_virtual_model_built_for_another_soc_is_refused_by_the_board(
    tmp_path: Path, make_daemon: DaemonFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    """export_rknn(target_platform='rk3566') then load_rknn on an rk3588 board: refused at init_runtime
    with both SoCs named, as the toolkit refuses a model built for another platform; rk3588 runs."""
    board: DaemonProcess = make_daemon("--soc", "rk3588")
    model = models.small_cnn(tmp_path / "cnn.onnx")
    for platform, expected in (("rk3566", -1), ("rk3588", 0)):
        exported = tmp_path / f"{platform}.rknn"
        rknn = RKNN(toolkit="host")
        try:
            assert rknn.config(target_platform=platform) == 0
            assert rknn.load_onnx(str(model)) == 0 and rknn.build(do_quantization=False) == 0
            assert rknn.export_rknn(str(exported)) == 0
        finally:
            rknn.release()
        rknn = RKNN(toolkit="host")
        try:
            assert rknn.load_rknn(str(exported)) == 0
            assert rknn.init_runtime(target="rk3588", device_id=board.url) == expected, platform
            if expected == 0:
                assert rknn.inference(inputs=[np.zeros((1, 3, 16, 16), np.float32)]) is not None
        finally:
            rknn.release()
        err = capfd.readouterr().err
        if expected == -1:
            assert "was built for rk3566, but the board at" in err and "target_platform='rk3588'" in err


def test_a_script_that_changed_only_its_import_line_finds_the_toolkits_other_modules(tmp_path: Path) -> None:
    """`from rknn_client import RKNN` in place of `from rknn.api import RKNN`; the script's
    `from rknn.utils import onnx_edit` and `from rknn.api.custom_op import get_node_attr` stay."""
    script = tmp_path / "script.py"
    script.write_text(
        "from rknn_client import RKNN\n"
        "from rknn.utils import onnx_edit\n"
        "from rknn.utils._onnx_edit import onnx_edit as same\n"
        "from rknn.api.custom_op import get_node_attr\n"
        "import rknn_client.compat.onnx_edit as ours\n"
        "assert onnx_edit is same is ours.onnx_edit and callable(get_node_attr)\n"
        "print('imports ok', RKNN.__module__)\n"
    )
    env = {**os.environ, ENV_TOOLKIT: "host"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "imports ok rknn_client.compat.rknn" in done.stdout
