"""MMSE calibration: per tensor, the int8 range that minimises the mean squared quantization error.

ONNX Runtime has no MSE calibrator, so this one collects the activations itself: a first pass over the
calibration samples finds each tensor's min/max (widened to include 0, as ONNX Runtime does), a second
builds a histogram of HISTOGRAM_BINS bins over that range. The candidate ranges are the min/max range
shrunk by a factor alpha in (0, 1] (CANDIDATES steps, both ends together); for each, the values (bin
centres, weighted by count) are quantized the way quantize_static quantizes activations (int8,
asymmetric: scale = (hi - lo) / 255, zero_point = round(-128 - lo / scale)), dequantized, and the
squared error summed. The range with the smallest error wins; ties go to the wider range. So an MMSE
range is never wider than the MinMax range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from rknn_client.accuracy.capture import expose_all_layers, tensor_types
from rknn_client.accuracy.layers import FLOAT_TYPES
from rknn_client.accuracy.session import open_session, run_session

HISTOGRAM_BINS = 2048
CANDIDATES = 100
INT8_MIN, INT8_MAX = -128, 127


def quantization_mse(values: np.ndarray, weights: np.ndarray, low: float, high: float) -> float:
    """Weighted mean squared error of int8 asymmetric quantize/dequantize over [low, high]."""
    return float(_mse(values, weights, np.array([low]), np.array([high]))[0])


def _mse(values: np.ndarray, weights: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Weighted MSE for each candidate range (lows[k], highs[k]) at once."""
    scale = ((highs - lows) / (INT8_MAX - INT8_MIN))[:, np.newaxis]
    zero_point = np.round(INT8_MIN - lows[:, np.newaxis] / scale)
    quantized = np.clip(np.round(values[np.newaxis] / scale) + zero_point, INT8_MIN, INT8_MAX)
    error = (quantized - zero_point) * scale - values[np.newaxis]
    return np.asarray((error**2 * weights).sum(axis=1) / weights.sum())


def search_range(counts: np.ndarray, edges: np.ndarray) -> tuple[float, float]:
    """The MSE-minimal range for a histogram (counts over edges); see the module docstring."""
    low, high = min(float(edges[0]), 0.0), max(float(edges[-1]), 0.0)
    if high - low <= 0.0 or counts.sum() == 0:
        return low, high
    centres = (edges[:-1] + edges[1:]) / 2.0
    alphas = np.linspace(1.0, 1.0 / CANDIDATES, CANDIDATES)
    errors = _mse(centres.astype(np.float64), counts.astype(np.float64), alphas * low, alphas * high)
    best = int(np.argmin(errors))
    return float(alphas[best] * low), float(alphas[best] * high)


def mmse_ranges(
    model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, tuple[float, float]]:
    """MMSE range of every floating-point activation (graph inputs and node outputs) over the samples."""
    exposed, layers = expose_all_layers(model)
    types = tensor_types(model)
    names = [layer.tensor_name for layer in layers if types.get(layer.tensor_name) in FLOAT_TYPES]
    session = open_session(exposed)
    feed_names = [spec.name for spec in session.get_inputs()]
    outputs = [name for name in names if name not in feed_names]

    def activations(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = dict(zip(outputs, run_session(session, sample, outputs), strict=True))
        values.update({name: np.asarray(sample[name]) for name in names if name in feed_names})
        return values

    lows = dict.fromkeys(names, np.inf)
    highs = dict.fromkeys(names, -np.inf)
    for sample in samples:
        for name, value in activations(sample).items():
            lows[name] = min(lows[name], float(np.min(value)))
            highs[name] = max(highs[name], float(np.max(value)))
    edges = {
        name: np.linspace(min(lows[name], 0.0), max(highs[name], 0.0), HISTOGRAM_BINS + 1) for name in names
    }
    counts = {name: np.zeros(HISTOGRAM_BINS, np.int64) for name in names}
    for sample in samples:
        for name, value in activations(sample).items():
            if edges[name][-1] > edges[name][0]:
                counts[name] += np.histogram(value, bins=edges[name])[0]
    return {name: search_range(counts[name], edges[name]) for name in names}
