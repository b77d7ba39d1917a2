"""config/build emulation: float and built models side by side, options checked."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from accuracy_cnn import MEAN, STD, build_cnn

from rknn_client.accuracy.analysis import analyse
from rknn_client.accuracy.build import QuantConfig, build_models
from rknn_client.accuracy.errors import AccuracyError


def test_build_quantized_and_float(tmp_path: Path, dataset: Path, test_image: Path) -> None:
    config = QuantConfig(MEAN, STD, quantized_algorithm="mmse", quantized_method="layer")
    built = build_models(build_cnn(), tmp_path / "q", config, True, dataset)
    ops = {node.op_type for node in onnx.load(built.quant_model).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Sub", "Div"} <= ops

    plain = build_models(build_cnn(), tmp_path / "f", config, do_quantization=False)
    assert plain.quant_model == plain.float_model

    out = tmp_path / "snap"
    analyse(built.float_model, built.quant_model, [test_image], out, runtime_layers=[])
    assert (out / "runtime").is_dir()
    analyse(plain.float_model, plain.quant_model, [test_image], out)
    assert not (out / "runtime").exists()


def test_build_refuses_what_it_cannot_emulate(tmp_path: Path, dataset: Path) -> None:
    with pytest.raises(AccuracyError, match="w4a16"):
        build_models(build_cnn(), tmp_path, QuantConfig(quantized_dtype="w4a16"), True, dataset)
    with pytest.raises(AccuracyError, match="needs a dataset"):
        build_models(build_cnn(), tmp_path, QuantConfig(), True, None)
