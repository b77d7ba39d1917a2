"""Input contract: mean/std baked into the model, image/npy loading, clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from accuracy_cnn import MEAN, SHAPE, STD, build_cnn, image_array
from PIL import Image

from rknn_client.accuracy.analysis import REPORT_FILE, analyse
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.preprocess import bake_normalization, input_specs, load_input, read_dataset


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def test_baked_model_on_raw_input_equals_original_on_normalised_input() -> None:
    original = build_cnn()
    x = image_array(5).transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    mean = np.array(MEAN[0], np.float32).reshape(1, 3, 1, 1)
    std = np.array(STD[0], np.float32).reshape(1, 3, 1, 1)

    baked = bake_normalization(original, MEAN, STD)

    onnx.checker.check_model(baked)
    assert [node.op_type for node in baked.graph.node[:2]] == ["Sub", "Div"]
    np.testing.assert_allclose(_run(baked, x), _run(original, (x - mean) / std), rtol=1e-5, atol=1e-6)


def test_identity_normalisation_leaves_the_model_alone() -> None:
    original = build_cnn()
    assert bake_normalization(original, [[0, 0, 0]], [[1, 1, 1]]) == original
    assert bake_normalization(original, None, None) == original


@pytest.mark.parametrize(
    ("mean", "std", "message"),
    [([[1, 2]], None, "has 2 values"), ([[0]], [[0]], "contain 0"), ([[0], [0]], None, "2 entries")],
)
def test_bad_normalisation_is_refused(
    mean: list[list[float]], std: list[list[float]] | None, message: str
) -> None:
    with pytest.raises(AccuracyError, match=message):
        bake_normalization(build_cnn(), mean, std)


def test_image_is_read_as_nchw_float(tmp_path: Path) -> None:
    picture = image_array(3)
    Image.fromarray(picture).save(tmp_path / "a.bmp")
    spec = input_specs(build_cnn())[0]

    array = load_input(tmp_path / "a.bmp", spec)

    assert array.shape == SHAPE and array.dtype == np.float32
    np.testing.assert_array_equal(array[0], picture.transpose(2, 0, 1))


def test_npy_is_used_as_is_and_shape_checked(tmp_path: Path) -> None:
    spec = input_specs(build_cnn())[0]
    good = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    np.save(tmp_path / "good.npy", good)
    np.save(tmp_path / "bad.npy", good.reshape(1, 32, 32, 3))
    np.testing.assert_array_equal(load_input(tmp_path / "good.npy", spec), good)
    with pytest.raises(AccuracyError, match="needs"):
        load_input(tmp_path / "bad.npy", spec)


def test_dataset_paths_are_relative_to_the_list(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "list.txt").write_text("a.png b.npy\n\n/abs/c.jpg\n")
    assert read_dataset(tmp_path / "sub" / "list.txt") == [
        [tmp_path / "sub" / "a.png", tmp_path / "sub" / "b.npy"],
        [Path("/abs/c.jpg")],
    ]


def test_an_image_of_another_size_is_resized_to_the_input(
    tmp_path: Path, float_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The toolkit resizes with OpenCV (this used to be refused): same input shape, and a warning."""
    Image.fromarray(np.full((20, 30, 3), 77, np.uint8)).save(tmp_path / "small.png")
    spec = input_specs(onnx.load(str(float_model)))[0]
    with caplog.at_level("WARNING", logger="rknn_client.accuracy"):
        array = load_input(tmp_path / "small.png", spec)
    assert array.shape[2:] == (32, 32) and np.all(array == 77)
    assert "resized from 30x20 to the model input's 32x32 (WxH)" in caplog.text


def test_missing_and_unsupported_inputs(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    with pytest.raises(AccuracyError, match=r"no such input file: .*nope\.png"):
        analyse(float_model, quant_model, [tmp_path / "nope.png"], tmp_path / "snap")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(AccuracyError, match="unsupported input file type"):
        analyse(float_model, quant_model, [tmp_path / "x.txt"], tmp_path / "snap")
    with pytest.raises(AccuracyError, match="2 input"):
        analyse(float_model, quant_model, [test_image, test_image], tmp_path / "snap")
    with pytest.raises(AccuracyError, match="cannot read ONNX model"):
        analyse(tmp_path / "none.onnx", quant_model, [test_image], tmp_path / "snap")


def test_unwritable_output_dir(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(AccuracyError, match="not writable"):
        analyse(float_model, quant_model, [test_image], blocker / "snap")


def test_a_rerun_replaces_the_report_only_at_the_end(
    tmp_path: Path, float_model: Path, quant_model: Path, test_image: Path
) -> None:
    out = tmp_path / "snap"
    analyse(float_model, quant_model, [test_image], out)
    assert (out / REPORT_FILE).exists()
    (tmp_path / "corrupt.png").write_bytes(b"not a png")
    with pytest.raises(AccuracyError):
        analyse(float_model, quant_model, [tmp_path / "corrupt.png"], out)
    assert (out / REPORT_FILE).exists()  # bad input is refused before anything is touched
    (out / "golden" / "stale_tensor.txt").write_bytes(b"")
    (out / "golden" / "npy" / "stale_tensor.npy").write_bytes(b"")
    analyse(float_model, quant_model, [test_image], out)
    assert not (out / "golden" / "stale_tensor.txt").exists()
    assert not (out / "golden" / "npy" / "stale_tensor.npy").exists()
    assert not list(out.glob(".*"))
