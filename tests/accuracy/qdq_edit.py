"""Deliberate damage to a built QDQ model, so a "runtime" differs from the simulator in one layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def negate_conv_weights(quant_model: Path, conv_node: str, out: Path) -> Path:
    """Copy of the QDQ model with the int8 weights of one conv negated."""
    model = onnx.load(quant_model)
    conv = next(node for node in model.graph.node if node.name == conv_node)
    dequantize = next(node for node in model.graph.node if node.output[0] == conv.input[1])
    weights = next(init for init in model.graph.initializer if init.name == dequantize.input[0])
    broken = -numpy_helper.to_array(weights).astype(np.int16)
    weights.CopyFrom(numpy_helper.from_array(np.clip(broken, -128, 127).astype(np.int8), weights.name))
    onnx.save(model, out)
    return out
