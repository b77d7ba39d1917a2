"""Calibration ranges of activations: min/max ('normal'), or an MSE-minimal range ('mmse', 'kl_divergence').

The collector runs the (fused) float model with the wanted tensors exposed: a first pass over the
calibration samples finds each tensor's min/max (widened to include 0), a second builds a histogram of
HISTOGRAM_BINS bins over that range. The MSE search follows the thresholds rknn-toolkit2 2.5.0 picks
(read off its `.quantization.cfg`: the kept maximum is the tensor's absolute peak times
(256k + 1) / 2048, k = 1..8): for each threshold T the range is [max(min, -T), min(max, T)], the
values (bin centres, weighted by count) are quantized on that asymmetric int8 grid (scale =
(hi - lo) / 255, zero_point = round(-128 - lo / scale)), dequantized, and the squared error summed. The
range with the smallest error wins; ties go to the wider range. So an MMSE range is never wider than
the min/max range. The toolkit's own MMSE also retunes weights layer by layer, which this does not;
its kl_divergence gives the very same ranges as its mmse on the models measured, so both use this search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from rknn_client.accuracy.capture import graph_inputs, tensor_types
from rknn_client.accuracy.session import open_session, run_session

HISTOGRAM_BINS = 2048
STEPS = 8
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
    peak = max(-low, high)
    thresholds = np.minimum(
        peak * (np.arange(1, STEPS + 1) * (HISTOGRAM_BINS // STEPS) + 1) / HISTOGRAM_BINS, peak
    )
    lows, highs = np.maximum(low, -thresholds), np.minimum(high, thresholds)
    errors = _mse(centres.astype(np.float64), counts.astype(np.float64), lows, highs)
    best = len(errors) - 1 - int(np.argmin(errors[::-1]))
    return float(lows[best]), float(highs[best])


def activation_ranges(
    model: onnx.ModelProto, names: Sequence[str], samples: Sequence[Mapping[str, np.ndarray]], algorithm: str
) -> dict[str, tuple[float, float]]:
    """The calibration range of each named tensor of `model` over the samples: min/max ('normal'), or
    the MMSE search ('mmse', and 'kl_divergence', for which rknn-toolkit2 2.5.0 gives the very same
    ranges). Every range includes 0, so that 0 is exact on the int8 grid."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    types = tensor_types(model)
    present = {info.name for info in exposed.graph.output}
    feed_names = {info.name for info in graph_inputs(model.graph)}
    computed = [name for name in names if name not in feed_names]
    for name in computed:
        if name not in present:
            exposed.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    session = open_session(exposed)

    def activations(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = dict(zip(computed, run_session(session, sample, computed), strict=True))
        values.update({name: np.asarray(sample[name]) for name in names if name in feed_names})
        return values

    lows = dict.fromkeys(names, 0.0)
    highs = dict.fromkeys(names, 0.0)
    for sample in samples:
        for name, value in activations(sample).items():
            lows[name] = min(lows[name], float(np.min(value)))
            highs[name] = max(highs[name], float(np.max(value)))
    if algorithm == "normal":
        return {name: (lows[name], highs[name]) for name in names}
    edges = {name: np.linspace(lows[name], highs[name], HISTOGRAM_BINS + 1) for name in names}
    counts = {name: np.zeros(HISTOGRAM_BINS, np.int64) for name in names}
    for sample in samples:
        for name, value in activations(sample).items():
            if edges[name][-1] > edges[name][0]:
                counts[name] += np.histogram(value, bins=edges[name])[0]
    return {name: search_range(counts[name], edges[name]) for name in names}
