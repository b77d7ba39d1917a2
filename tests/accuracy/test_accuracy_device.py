"""accuracy_analysis with a runtime side: the demo's MobileNetV2 built to int8, dumped by a real daemon."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from device_models import MEAN, PHOTO, SIZE, STD, calibration_set, small_mobilenet
from qdq_edit import negate_conv_weights

from demo.calibration import photo_crops
from rknn_client import RKNN, cli, connect
from rknn_client.accuracy.analysis import REPORT_FILE, AnalysisResult, analyse
from rknn_client.accuracy.build import QuantConfig, build_models
from rknn_client.accuracy.compare import ErrorPair
from rknn_client.accuracy.preprocess import input_specs, load_inputs
from rknn_client.accuracy.runtime_side import dump_runtime_layers
from rknn_server.testing import DaemonProcess
from tests.conftest import DaemonFactory

# conv_1 and its ReLU6 are one layer in the int8 model (quantize_static fuses them): the first
# convolution's value in every table is the ReLU6 output.
FIRST_CONV = "relu6_2_out"
# A projection conv (no activation) that feeds a residual Add, in the middle of the network.
BROKEN_CONV = "conv_84"


@dataclass(frozen=True)
class Files:
    model: Path
    dataset: Path
    image: Path


def known(pair: ErrorPair | None) -> ErrorPair:
    assert pair is not None
    return pair


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("mobilenet")
    image = photo_crops(PHOTO, root / "probe", 5, SIZE)[2]
    return Files(small_mobilenet(root / "mobilenet_v2.onnx"), calibration_set(root / "calib"), image)


def built(files: Files, do_quantization: bool) -> RKNN:
    rknn = RKNN()
    assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == 0
    assert rknn.load_onnx(str(files.model)) == 0
    assert rknn.build(do_quantization=do_quantization, dataset=str(files.dataset)) == 0
    return rknn


@pytest.fixture(scope="module")
def quantized(files: Files) -> Iterator[RKNN]:
    rknn = built(files, do_quantization=True)
    yield rknn
    rknn.release()


def analysed(rknn: RKNN) -> AnalysisResult:
    assert rknn.last_accuracy is not None
    return rknn.last_accuracy


def test_int8_error_grows_from_first_conv_to_output(
    quantized: RKNN,
    files: Files,
    host_daemon: DaemonProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "snapshot"
    assert quantized.accuracy_analysis([str(files.image)], str(out), device_id=host_daemon.url) == 0
    printed = capsys.readouterr().out
    result = analysed(quantized)

    assert result.has_runtime and result.only_runtime == ()
    assert result.row("conv_1_out").sides == {"golden"}
    rows = result.rows[result.rows.index(result.row(FIRST_CONV)) :]
    compared = [row for row in rows if row.runtime_entire is not None]
    assert len(compared) > 50
    assert all(known(row.runtime_entire).cos < 1.0 for row in compared)
    first, output = known(result.row(FIRST_CONV).runtime_entire), known(result.row("prob").runtime_entire)
    assert output.cos < first.cos
    assert "# runtime_error:" in printed
    line = re.search(
        r"^\[Softmax\] prob +(?:\d\.\d{5} \| \S+ +){2}(\d\.\d{5}) \| \S+ +\d\.\d{5} \| \S+$", printed, re.M
    )
    assert line is not None and line.group(1) == f"{output.cos:.5f}"
    print(f"golden vs runtime cosine: first conv {first.cos:.5f}, output {output.cos:.5f}")
    assert (out / REPORT_FILE).read_text().startswith(result.report)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["golden", "simulator", "runtime", REPORT_FILE, "map_name_to_file.txt"]
    )
    assert len(list((out / "runtime").glob("*.txt"))) >= len(compared)


def test_without_quantization_every_cosine_is_one(
    files: Files, host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    rknn = built(files, do_quantization=False)
    try:
        assert (
            rknn.accuracy_analysis([str(files.image)], str(tmp_path / "snap"), device_id=host_daemon.url) == 0
        )
        result = analysed(rknn)
    finally:
        rknn.release()
    assert all(row.sides == {"golden", "simulator", "runtime"} for row in result.rows)
    for row in result.rows:
        for pair in (row.entire, row.single, row.runtime_entire, row.single_sim):
            assert known(pair).cos == pytest.approx(1.0, abs=1e-6), row.name


def test_single_sim_points_at_the_one_layer_that_differs_on_the_runtime(
    files: Files, host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    models = build_models(files.model, tmp_path / "build", QuantConfig(MEAN, STD), True, files.dataset)
    broken = negate_conv_weights(models.quant_model, BROKEN_CONV, tmp_path / "broken.onnx")
    feeds = load_inputs([files.image], input_specs(onnx.load(models.float_model)))
    with connect(host_daemon.url) as device:
        dumped = dump_runtime_layers(device, broken, feeds)

    result = analyse(
        models.float_model, models.quant_model, feeds, tmp_path / "snap", [(d, d.array) for d in dumped]
    )

    broken_layer = f"{BROKEN_CONV}_out"
    off = [
        row.name for row in result.rows if row.single_sim is not None and known(row.single_sim).cos < 0.9999
    ]
    assert off == [broken_layer]
    with_runtime = [row for row in result.rows if row.runtime_entire is not None]
    differs = [
        row.name for row in with_runtime if abs(known(row.runtime_entire).cos - known(row.entire).cos) > 1e-6
    ]
    assert differs[0] == broken_layer and differs[-1] == "prob"
    at = [row.name for row in with_runtime].index(broken_layer)
    assert all(known(row.runtime_entire).cos < known(row.entire).cos for row in with_runtime[at : at + 3])


@pytest.mark.parametrize("case", ["missing input", "corrupt image", "output_dir under a file", "load_rknn"])
def test_bad_input_gives_minus_one_and_says_why(
    case: str,
    quantized: RKNN,
    files: Files,
    host_daemon: DaemonProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rknn, image, out = quantized, str(files.image), tmp_path / "snap"
    if case == "missing input":
        image, reason = str(tmp_path / "nope.png"), "no such input file"
    elif case == "corrupt image":
        image, reason = str(tmp_path / "broken.png"), f"cannot read image {tmp_path / 'broken.png'}"
        Path(image).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    elif case == "output_dir under a file":
        (tmp_path / "file").write_text("")
        out, reason = tmp_path / "file" / "snap", "not writable"
    else:
        rknn = RKNN()
        (tmp_path / "m.rknn").write_bytes(b"RKNN")
        assert rknn.load_rknn(str(tmp_path / "m.rknn")) == 0
        reason = "lacks the original model"

    assert rknn.accuracy_analysis([image], str(out), device_id=host_daemon.url) == -1
    err = capsys.readouterr().err
    assert err.startswith("E accuracy_analysis: ") and reason in err, err
    assert not (out / REPORT_FILE).exists()


def test_a_failed_run_leaves_no_report(
    quantized: RKNN,
    files: Files,
    make_daemon: DaemonFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "snap"
    assert quantized.accuracy_analysis([str(files.image)], str(out)) == 0
    assert (out / REPORT_FILE).exists() and not (out / "runtime").exists()
    gone = make_daemon()
    gone.stop()

    assert quantized.accuracy_analysis([str(files.image)], str(out), device_id=gone.url) == -1
    assert "E accuracy_analysis:" in capsys.readouterr().err
    assert not (out / REPORT_FILE).exists()


def test_cli_accuracy_against_a_daemon(
    files: Files, host_daemon: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snap"
    common = [str(files.model), "--input", str(files.image), "--output-dir", str(out)]
    assert cli.main(["accuracy", *common, "--device", host_daemon.url]) == 2
    assert "--dataset" in capsys.readouterr().err

    normalisation = ["--mean", ",".join(map(str, MEAN[0])), "--std", ",".join(map(str, STD[0]))]
    options = ["--dataset", str(files.dataset), "--algorithm", "normal", "--method", "layer", *normalisation]
    assert cli.main(["accuracy", *common, *options, "--device", host_daemon.url]) == 0
    table = (out / REPORT_FILE).read_text()
    assert "# simulator_error:" in table and "# runtime_error:" in table
    cells = r"(\d\.\d{5}) \| \S+ +"
    rows = re.findall(rf"^\[Softmax\] prob +{cells * 3}(\d\.\d{{5}}) \| \S+$", table, re.M)
    assert len(rows) == 1 and float(rows[0][0]) < 1.0 and float(rows[0][2]) < 1.0
    assert (out / "runtime").is_dir()
    # The terminal gets the worst layers first, not the whole table; --json has every layer.
    captured = capsys.readouterr()
    printed = captured.out
    assert "# simulator_error:" not in printed and str(out / REPORT_FILE) in printed
    # ... and is told what was written, and how much.
    files_written = sum(1 for path in out.rglob("*") if path.is_file())
    assert re.search(rf"wrote {files_written} files \([\d.]+ MB\) under {re.escape(str(out))}", captured.err)
    summary = printed.splitlines()[2:-1]
    worst = [min(float(c) for c in line.split()[-4:] if c != "-") for line in summary]
    assert worst == sorted(worst) and 0 < len(summary) <= 10
    assert cli.main(["accuracy", *common, *options, "--device", host_daemon.url, "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    cosines = [
        min(layer[side]["cos"] for side in ("entire", "runtime_entire") if layer[side] is not None)
        for layer in layers
        if layer["entire"] is not None or layer["runtime_entire"] is not None
    ]
    assert worst[0] == pytest.approx(min(cosines), abs=1e-5)
