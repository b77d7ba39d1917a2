"""End to end: analyse() on the tiny CNN, its int8 build and a deliberately broken "runtime"."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from qdq_edit import negate_conv_weights

from rknn_client.accuracy.analysis import MAP_FILE, REPORT_FILE, analyse
from rknn_client.accuracy.capture import LayerInfo, run_capture
from rknn_client.accuracy.compare import ErrorPair
from rknn_client.accuracy.preprocess import input_specs, load_inputs


def known(pair: ErrorPair | None) -> ErrorPair:
    """The pair a layer must have."""
    assert pair is not None
    return pair


FILE_NAME = re.compile(r"^[A-Za-z0-9_-]+\.txt$")


def test_int8_errors_grow_towards_the_output(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    result = analyse(float_model, quant_model, [test_image], tmp_path / "snap")

    # The raw image and the mean subtraction stay exact: the toolkit's first int8 tensor is the normalized image.
    assert (
        known(result.row("input").entire).euc == 0.0 and known(result.row("input_mean_sub").entire).euc == 0.0
    )
    first_conv = result.row("relu1")  # conv1 + Relu, fused as the toolkit fuses them
    # The toolkit splits a GlobalAveragePool over more than 7x7 into depthwise Conv stages: the
    # simulator's last stage reads a stage golden does not have, so that layer has no single-layer run.
    assert result.row("gap").single is None and result.row("gap_node_2conv0").sides == {"simulator"}
    compared = [
        row
        for row in result.rows[result.rows.index(first_conv) :]
        if row.entire is not None and row.name != "gap"
    ]
    assert len(compared) >= 8
    assert all(known(row.entire).cos < 1.0 - 1e-7 and known(row.single).cos < 1.0 - 1e-7 for row in compared)
    assert all(known(row.entire).euc > 0.0 and known(row.single).euc > 0.0 for row in compared)
    assert known(result.row("prob").entire).cos < known(first_conv.entire).cos
    # Relu/Clip fold into the conv before: the conv's own output is golden-only.
    assert result.row("conv1").sides == {"golden"}
    assert result.row("relu1").op_type == "Relu" and result.row("relu1").sides == {"golden", "simulator"}

    snap = tmp_path / "snap"
    for side in ("golden", "simulator"):
        names = sorted(p.name for p in (snap / side).glob("*.txt"))
        assert names and all(FILE_NAME.match(name) for name in names), names
        assert sorted(p.name for p in (snap / side / "npy").iterdir()) == [n[:-4] + ".npy" for n in names]
    assert "input.txt" in names and "input_mean_sub.txt" in names
    assert not (snap / "runtime").exists()
    # As the official example reads it: one value per line, flattened.
    golden_prob = np.genfromtxt(snap / "golden" / "prob.txt")
    assert golden_prob.shape == (10,)
    exact = np.load(snap / "golden" / "npy" / "prob.npy").ravel()
    np.testing.assert_allclose(golden_prob, exact, rtol=0, atol=5e-7)  # six decimals, as the toolkit writes
    assert np.load(snap / "golden" / "npy" / "prob.npy").shape == (1, 10)
    mapping = (snap / "map_name_to_file.txt").read_text().splitlines()
    assert mapping[0].split() == ["layer_name", "file_name"]
    assert ["relu1", "relu1.txt"] in [line.split() for line in mapping]

    text = (snap / REPORT_FILE).read_text()
    assert text == result.report
    assert "runtime_error" not in text
    assert re.search(r"^\[Softmax\] prob +\d\.\d{5} \| [0-9.]+ +\d\.\d{5} \| [0-9.]+$", text, re.M)
    assert re.search(r"^\[Conv\] conv1$", text, re.M)


def test_without_quantization_every_cosine_is_one(
    tmp_path: Path, float_model: Path, test_image: Path
) -> None:
    result = analyse(float_model, float_model, [test_image], tmp_path / "snap")

    assert all(row.sides == {"golden", "simulator"} for row in result.rows)
    for row in result.rows:
        assert known(row.entire).cos == pytest.approx(1.0, abs=1e-6)
        assert known(row.single).cos == pytest.approx(1.0, abs=1e-6)
        assert known(row.entire).euc == pytest.approx(0.0, abs=1e-4)


def test_runtime_single_sim_points_at_the_broken_layer(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    broken = negate_conv_weights(quant_model, "project_node", tmp_path / "broken.onnx")
    feeds = load_inputs([test_image], input_specs(onnx.load(float_model)))
    runtime_layers = run_capture(broken, feeds)

    result = analyse(float_model, quant_model, [test_image], tmp_path / "snap", runtime_layers)

    assert result.has_runtime
    with_single_sim = [row for row in result.rows if row.single_sim is not None]
    assert {row.name for row in with_single_sim} == {
        row.name for row in result.rows if "simulator" in row.sides
    }
    bad = [
        row.name
        for row in with_single_sim
        if known(row.single_sim).cos < 0.999 or known(row.single_sim).euc > 1e-3
    ]
    assert bad == ["project"]
    names = [row.name for row in result.rows]
    broken_at = names.index("project")
    for row in result.rows[:broken_at]:
        if row.runtime_entire is not None:
            assert row.runtime_entire == row.entire
    for name in ("project", "add1", "relu2"):
        row = result.row(name)
        assert known(row.runtime_entire).cos < known(row.entire).cos - 1e-3
    assert result.only_runtime == ()
    runtime_files = {p.name for p in (tmp_path / "snap" / "runtime").glob("*.txt")}
    assert runtime_files == {f"{row.name}.txt" for row in result.rows if "runtime" in row.sides}
    np.testing.assert_allclose(
        np.genfromtxt(tmp_path / "snap" / "runtime" / "project.txt"),
        np.load(tmp_path / "snap" / "runtime" / "npy" / "project.npy").ravel(),
        rtol=0,
        atol=5e-7,  # six decimals, as the toolkit writes
    )
    text = (tmp_path / "snap" / REPORT_FILE).read_text()
    assert "# runtime_error:" in text and "single_sim" in text
    header = next(line for line in text.splitlines() if line.startswith("layer_name"))
    assert header.split() == ["layer_name", "simulator_error", "runtime_error"]


def test_runtime_layers_matched_by_name_nhwc_and_unknown(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    """A board-like runtime: original tensor names, NHWC layout, some layers missing, hostile names."""
    simulator = {
        info.tensor_name: array for info, array in run_capture(quant_model, {"input": _image(test_image)})
    }
    delivered = [
        (
            LayerInfo(0, "ConvClip", "n", "clip1"),
            simulator["clip1_DequantizeLinear_Output"].transpose(0, 2, 3, 1),
        ),
        (LayerInfo(1, "Softmax", "n", "prob"), simulator["prob"]),
        (LayerInfo(2, "../../Evil", "n", "../../../escape/x"), np.zeros(3, np.float32)),
    ]

    result = analyse(float_model, quant_model, [test_image], tmp_path / "snap", delivered)

    assert result.row("clip1").runtime_entire == result.row("clip1").entire
    assert result.row("prob").runtime_entire == result.row("prob").entire
    assert result.row("add1").runtime_entire is None and result.row("add1").single_sim is None
    assert result.only_runtime == ("../../../escape/x",)
    written = sorted(p.name for p in (tmp_path / "snap" / "runtime").glob("*.txt"))
    assert written == sorted(["clip1.txt", "prob.txt", "_________escape_x.txt"])
    # Matched tensors are stored in the golden layout (NCHW), as the toolkit's runtime/ folder is.
    assert np.load(tmp_path / "snap" / "runtime" / "npy" / "clip1.npy").shape == simulator["clip1"].shape
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == sorted(
        ["golden", "simulator", "runtime", REPORT_FILE, MAP_FILE]
    )


def _image(path: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB")).transpose(2, 0, 1)[np.newaxis].astype(np.float32)
