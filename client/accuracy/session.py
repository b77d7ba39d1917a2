"""ONNX Runtime sessions for emulation, all made the same way so every run uses the same arithmetic.

Graph optimisations are off: fusions (e.g. DequantizeLinear->Conv->QuantizeLinear into QLinearConv) would
compute a layer differently in a whole-model run than in a single-layer run, and the error analysis
compares the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from rknn_client.accuracy.errors import AccuracyError


def open_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session for an in-memory model, without graph optimisations."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT raises its own exception types for bad graphs
        raise AccuracyError(f"ONNX Runtime cannot load the model: {exc}") from exc


def run_session(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], names: Sequence[str]
) -> list[np.ndarray]:
    """Run and return the named outputs; ORT's errors (shape, dtype) become AccuracyError."""
    try:
        return [np.asarray(value) for value in session.run(list(names), dict(feeds))]
    except Exception as exc:
        raise AccuracyError(f"ONNX Runtime failed to run the model: {exc}") from exc
