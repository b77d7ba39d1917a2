"""`build(do_quantization=True, dataset=...)` emulated with ONNX Runtime's static quantization (int8 QDQ).

Mapping of the toolkit's options onto `onnxruntime.quantization.quantize_static` (QuantFormat.QDQ,
int8 activations and weights, asymmetric activations, symmetric weights):
- quantized_algorithm 'normal' -> CalibrationMethod.MinMax (min/max of the calibration data);
- 'kl_divergence' -> CalibrationMethod.Entropy (ONNX Runtime's KL-divergence threshold search);
- 'mmse' -> no ONNX Runtime equivalent: `calibrate.mmse_ranges` computes the ranges, which are handed
  to quantize_static as TensorQuantOverrides rmin/rmax for every activation (its own MinMax pass still
  runs, the overrides take precedence);
- quantized_method 'channel' -> per_channel=True (weights per output channel), 'layer' -> per_channel=False.
Calibration samples come from dataset.txt through the same input loader as inference, so the model
given here must already have mean/std baked in (`preprocess.bake_normalization`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from rknn_client.accuracy.calibrate import mmse_ranges
from rknn_client.accuracy.capture import load_model
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.preprocess import input_specs, load_inputs, read_dataset

ALGORITHMS = {
    "normal": CalibrationMethod.MinMax,
    "mmse": CalibrationMethod.MinMax,
    "kl_divergence": CalibrationMethod.Entropy,
}
METHODS = {"channel": True, "layer": False}


class _Samples(CalibrationDataReader):
    """Hands quantize_static the calibration samples one by one."""

    def __init__(self, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        self._samples: Iterator[Mapping[str, np.ndarray]] = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        sample = next(self._samples, None)
        return None if sample is None else dict(sample)


def load_dataset(
    model: onnx.ModelProto, dataset_txt: str | Path, rgb2bgr: bool = False
) -> list[dict[str, np.ndarray]]:
    """Every sample listed in dataset.txt, read for the model's inputs."""
    specs = input_specs(model)
    return [load_inputs(paths, specs, rgb2bgr) for paths in read_dataset(dataset_txt)]


def quantize_model(
    float_model_path: str | Path,
    out_path: str | Path,
    dataset_txt: str | Path,
    algorithm: str = "normal",
    method: str = "channel",
    rgb2bgr: bool = False,
) -> None:
    """Write the int8 QDQ model of `float_model_path` to `out_path`, calibrated on dataset.txt."""
    if algorithm not in ALGORITHMS:
        raise AccuracyError(f"quantized_algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if method not in METHODS:
        raise AccuracyError(f"quantized_method {method!r} is not one of {', '.join(METHODS)}")
    model = load_model(float_model_path)
    samples = load_dataset(model, dataset_txt, rgb2bgr)
    extra_options: dict[str, object] = {}
    if algorithm == "mmse":
        extra_options["TensorQuantOverrides"] = {
            name: [{"rmin": np.float32(low), "rmax": np.float32(high)}]
            for name, (low, high) in mmse_ranges(model, samples).items()
        }
    try:
        quantize_static(
            str(float_model_path),
            str(out_path),
            _Samples(samples),
            quant_format=QuantFormat.QDQ,
            per_channel=METHODS[method],
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=ALGORITHMS[algorithm],
            extra_options=extra_options,
        )
    except Exception as exc:  # ONNX Runtime's own exception types (Fail, InvalidArgument) included
        raise AccuracyError(f"quantization failed: {exc}") from exc
