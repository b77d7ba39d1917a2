"""Auto mode with RKNN-Toolkit2 installed and a virtual board (a host-runtime daemon): the script a
newcomer runs first behaves as without a toolkit. config() without target_platform stops it at once
with the same one message; the line saying the model was rebuilt for the virtual board always shows,
once; accuracy_analysis against the board works after the toolkit's build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rknn_client import RKNN
from rknn_client.toolkit import Toolkit
from rknn_server.testing import DaemonProcess
from tests import models
from tests.toolkit.conftest import SIZE

MEAN = [[123.675, 116.28, 103.53]]
STD = [[58.395, 57.12, 57.375]]
REBUILT = "is a virtual board (it runs ONNX models, not what RKNN-Toolkit2 compiled)"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("auto-data")
    rng = np.random.default_rng(11)
    for i in range(2):
        np.save(folder / f"c{i}.npy", rng.integers(0, 256, (1, 3, SIZE, SIZE)).astype(np.float32))
    (folder / "dataset.txt").write_text("c0.npy\nc1.npy\n")
    return folder / "dataset.txt"


def test_config_without_target_platform_stops_before_the_toolkit_is_asked(
    toolkit: Toolkit, capfd: pytest.CaptureFixture[str]
) -> None:
    """The toolkit would print its error and tracebacks, then every later call fail; here the script
    stops at config() with one message, exactly as where no toolkit is installed."""
    rknn = RKNN(toolkit="auto")
    try:
        with pytest.raises(ValueError, match="'target_platform' has not been set yet"):
            rknn.config(mean_values=MEAN, std_values=STD)
        assert not rknn._route.started
        err = capfd.readouterr().err
        assert err.count("E config:") == 1 and "Traceback" not in err
    finally:
        rknn.release()


def test_the_rebuilt_line_shows_once_without_verbose_and_accuracy_runs_against_the_board(
    toolkit: Toolkit,
    host_daemon: DaemonProcess,
    dataset: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    model = models.small_cnn(tmp_path / "cnn.onnx", size=SIZE)
    image = np.random.default_rng(2).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    np.save(tmp_path / "probe.npy", image.transpose(2, 0, 1)[None].astype(np.float32))
    rknn = RKNN(toolkit="auto")  # verbose=False: the default
    try:
        assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == 0
        assert rknn.load_onnx(str(model)) == 0
        assert rknn.build(do_quantization=True, dataset=str(dataset)) == 0
        assert rknn._route.started  # built by the real toolkit
        analysed = rknn.accuracy_analysis(
            inputs=[str(tmp_path / "probe.npy")], output_dir=str(tmp_path / "snap"), device_id=host_daemon.url
        )
        assert analysed == 0
        assert rknn.init_runtime(device_id=host_daemon.url) == 0
        assert rknn.inference(inputs=[image]) is not None
    finally:
        rknn.release()
    said = capfd.readouterr()
    assert (said.out + said.err).count(REBUILT) == 1
    assert (tmp_path / "snap" / "runtime").is_dir() and (tmp_path / "snap" / "error_analysis.txt").is_file()
    assert "I accuracy_analysis: wrote " in said.out
