"""The runtime side of accuracy analysis: the built model run once on a daemon, every layer sent back.

The daemon runs exactly the model the simulator ran (the built QDQ model, or the float model without
quantization), on the same input arrays. Inputs travel in NCHW, the layout the engine reads images in;
the daemon converts them when its runtime wants another layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rknn_client.accuracy.errors import AccuracyError
from rknn_client.device import Device
from rknn_proto.messages import LayerDump


def dump_runtime_layers(
    device: Device, model: Path, feeds: Mapping[str, np.ndarray], target: str = ""
) -> list[LayerDump]:
    """Upload `model` (unless cached), run it once with per-layer capture, release the session."""
    if not device.info().capabilities.get("layer_dumps", False):
        raise AccuracyError(
            f"the daemon at {device.endpoint.description} ({device.info().runtime} runtime) cannot dump "
            "per-layer tensors; run the analysis without target/device_id for golden vs simulator only"
        )
    with device.load(model, target=target) as session:
        missing = [spec.name for spec in session.inputs if spec.name not in feeds]
        if missing:
            raise AccuracyError(f"no data for the runtime's input(s): {', '.join(missing)}")
        arrays = [np.asarray(feeds[spec.name], spec.dtype) for spec in session.inputs]
        layouts = ["NCHW" if array.ndim == 4 else "UNDEFINED" for array in arrays]
        return list(session.dump_layers(arrays, layouts))
