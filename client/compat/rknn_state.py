"""What an `RKNN` object holds between the toolkit's calls, as two explicit objects.

The toolkit's API is a sequence of calls on one object (config, load, build, init_runtime, inference,
release), each leaving state for the next. Kept as loose attributes, which call resets what was
implicit; here a load starts a new `ModelSource` (nothing of the previous model survives it) and
init_runtime or release a new `Runtime` (the previous one closed first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rknn_client.accuracy.build import BuiltModels
from rknn_client.compat.rknn_file import ModelFileKind
from rknn_client.device import Device
from rknn_client.errors import RknnError
from rknn_client.pipeline import Pipeline
from rknn_client.session import Session


@dataclass(frozen=True)
class OnnxLoad:
    """load_onnx()'s arguments, used when the model is built."""

    path: Path
    inputs: Any
    input_size_list: Any
    outputs: Any


@dataclass
class ModelSource:
    """The current model: loaded on the host path (an ONNX model, then built; or an .rknn file) or in
    the real toolkit's worker (loaded there, maybe built, exported once for a board)."""

    onnx: OnnxLoad | None = None
    rknn_path: Path | None = None
    rknn_kind: ModelFileKind = field(default_factory=ModelFileKind)  # what the .rknn file is
    in_toolkit: bool = False
    toolkit_built: bool = False
    exported: Path | None = None  # the toolkit's .rknn for init_runtime(target=...)
    built: Path | None = None  # the host path's model for the daemon: int8 QDQ or float
    models: BuiltModels | None = None  # the float and quantized models build() made
    build_settings: dict[str, Any] = field(default_factory=dict)
    dynamic_sets: list[list[tuple[int, ...]]] | None = None  # the input shape sets the model takes


@dataclass
class Runtime:
    """What init_runtime() opened: the daemon, the session on it, and inference's frame count."""

    device: Device | None = None
    session: Session | None = None
    pipeline: Pipeline | None = None  # async_mode's frames in flight
    previous: tuple[int, list[np.ndarray]] | None = None  # async_mode's last result (frame id, outputs)
    frames: int = 0
    target: str = ""
    simulator: bool = False  # init_runtime() ran in the toolkit: inference goes there

    def close(self) -> str:
        """Close the pipeline, release the session and close the device; a release the daemon
        refused is returned for the caller to log ('' when none)."""
        refused = ""
        if self.pipeline is not None:
            self.pipeline.close()
        if self.session is not None:
            try:
                self.session.release()
            except RknnError as exc:
                refused = str(exc)
        if self.device is not None:
            self.device.close()
        return refused
