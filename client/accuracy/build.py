"""`config()` + `load_onnx()` + `build()` emulated: the float (golden) and built (simulator) ONNX models.

The float model is the loaded model with mean/std baked in; the built model is its int8 QDQ
quantization, or the float model itself when `do_quantization=False` (then the simulator is the golden
model and every layer's error is zero). Only the toolkit's default dtype (w8a8, asymmetric int8) is
emulated; `target_platform` does not change the emulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from rknn_client.accuracy.capture import load_model
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.accuracy.preprocess import bake_normalization
from rknn_client.accuracy.quantize import quantize_model

EMULATED_DTYPES = frozenset({"w8a8", "asymmetric_quantized-8"})


@dataclass(frozen=True)
class QuantConfig:
    """The `config()` options that change what the simulator runs."""

    mean_values: Sequence[Sequence[float]] | None = None
    std_values: Sequence[Sequence[float]] | None = None
    quantized_dtype: str = "w8a8"
    quantized_algorithm: str = "normal"
    quantized_method: str = "channel"
    target_platform: str | None = None
    quant_img_RGB2BGR: bool = False


@dataclass(frozen=True)
class BuiltModels:
    """Paths of the golden (float) and simulator (built) models."""

    float_model: Path
    quant_model: Path


def build_models(
    source: onnx.ModelProto | str | Path,
    work_dir: str | Path,
    config: QuantConfig,
    do_quantization: bool = True,
    dataset: str | Path | None = None,
    fixed_shapes: bool = True,
) -> BuiltModels:
    """Write `float.onnx` (and `quant.onnx` when quantizing) into work_dir; `fixed_shapes=False` for a
    model that will run at several input shapes (see quantize_model)."""
    if do_quantization and config.quantized_dtype not in EMULATED_DTYPES:
        raise AccuracyError(f"quantized_dtype {config.quantized_dtype!r} is not emulated; use 'w8a8'")
    if do_quantization and dataset is None:
        raise AccuracyError("build(do_quantization=True) needs a dataset")
    folder = Path(work_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AccuracyError(f"cannot create {folder}: {exc}") from exc
    float_path = folder / "float.onnx"
    onnx.save(bake_normalization(load_model(source), config.mean_values, config.std_values), float_path)
    if not do_quantization or dataset is None:
        return BuiltModels(float_path, float_path)
    quant_path = folder / "quant.onnx"
    quantize_model(
        float_path,
        quant_path,
        dataset,
        config.quantized_algorithm,
        config.quantized_method,
        config.quant_img_RGB2BGR,
        fixed_shapes,
    )
    return BuiltModels(float_path, quant_path)
