"""`RKNNLite`: rknn-toolkit-lite2's class, which users swap in with
`from rknnlite.api import RKNNLite as RKNN`. Same machinery as RKNN, the lite signatures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rknn_client.compat.core_masks import NpuCoreMasks
from rknn_client.compat.rknn import RKNN


class RKNNLite(NpuCoreMasks):
    def __init__(self, verbose: bool | str = False, verbose_file: str | None = None) -> None:
        self._rknn = RKNN(verbose=verbose, verbose_file=verbose_file, toolkit="host")  # no converter in lite

    def load_rknn(self, path: str) -> int:
        return self._rknn.load_rknn(path)

    def load_onnx(self, model: str, **kwargs: Any) -> int:
        """Not in rknn-toolkit-lite2; kept so the same script runs a model on the host runtime."""
        return self._rknn.load_onnx(model, **kwargs)

    def list_devices(self) -> tuple[list[str], list[str]]:
        return self._rknn.list_devices()

    def init_runtime(
        self,
        target: str | None = None,
        device_id: str | None = None,
        async_mode: bool = False,
        core_mask: int = NpuCoreMasks.NPU_CORE_AUTO,
        **kwargs: Any,
    ) -> int:
        return self._rknn.init_runtime(
            target=target, device_id=device_id, async_mode=async_mode, core_mask=core_mask, **kwargs
        )

    def inference(
        self,
        inputs: Any,
        data_type: str | None = None,
        data_format: str | Sequence[str] | None = None,
        inputs_pass_through: Sequence[int] | None = None,
        get_frame_id: bool = False,
    ) -> list[np.ndarray] | None:
        return self._rknn.inference(inputs, data_format, inputs_pass_through, get_frame_id)

    def get_sdk_version(self) -> str | None:
        return self._rknn.get_sdk_version()

    def release(self) -> None:
        self._rknn.release()
