"""The board backend: models run by Rockchip's librknnrt / librknnmrt through ctypes."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rknn_proto import model_container
from rknn_proto.messages import FrequencyList
from rknn_server.board.platform import PlatformInfo, read_frequencies
from rknn_server.runtime.base import (
    Backend,
    BackendCapabilities,
    FrequencyOutcome,
    ModelFormatError,
    RuntimeOptions,
    VersionInfo,
)
from rknn_server.runtime.rknnrt.freq_pin import pinned_frequencies
from rknn_server.runtime.rknnrt.library import RuntimeLibrary
from rknn_server.runtime.rknnrt.model import RknnrtModel, init_flags
from rknn_server.runtime.rknnrt.plugins import DEFAULT_PLUGIN_DIR, load_plugins


class RknnrtBackend(Backend):
    name = "rknnrt"
    model_suffixes = (".rknn",)

    def __init__(self, lib_path: Path, probe: PlatformInfo, plugin_dir: Path | None) -> None:
        """Load the library and, from `plugin_dir` (default: the documented Linux plugin folder under
        the probe's root, when it exists), the custom-op plugins registered with every model."""
        self._library = RuntimeLibrary(lib_path)
        self._probe = probe
        default_dir = probe.root / DEFAULT_PLUGIN_DIR.relative_to("/")
        self._plugin_dir = (
            plugin_dir if plugin_dir is not None else (default_dir if default_dir.is_dir() else None)
        )
        self._plugins = load_plugins(self._plugin_dir) if self._plugin_dir is not None else ()
        # The open sessions of each (model file, init flags): a new one duplicates a context of
        # theirs (rknn_dup_context), so that one model's weights are in NPU memory once.
        self._families: dict[tuple[str, int], weakref.WeakSet[RknnrtModel]] = {}
        self._family = threading.Lock()
        symbols = self._library.symbols
        self.capabilities = BackendCapabilities(
            perf_per_layer=self._library.has_general_api,
            memory_detail=True,
            layer_dumps=True,
            core_mask=probe.npu_cores > 1 and "rknn_set_core_mask" in symbols,
            dynamic_shape="rknn_set_input_shapes" in symbols,
            fix_freq=True,
        )

    @property
    def shares_models(self) -> bool:  # type: ignore[override]
        """Sessions of a model share one context's weights where the library can duplicate it."""
        return "rknn_dup_context" in self._library.symbols

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt from its arguments in a session's worker process (a loaded library cannot travel)."""
        return (RknnrtBackend, (self._library.path, self._probe, self._plugin_dir))

    @property
    def library(self) -> RuntimeLibrary:
        return self._library

    def version(self) -> VersionInfo:
        return VersionInfo(
            api=f"{self._library.kind} {self._library.version}",
            driver=self._probe.driver_version or "unknown",
        )

    def open(self, model_path: Path, options: RuntimeOptions) -> RknnrtModel:
        if model_container.file_is_virtual(model_path):
            raise ModelFormatError(
                f"{model_path.name} is not a real RKNN model: {model_container.VIRTUAL_ONLY}"
            )
        key = (str(model_path), init_flags(options, self._library.has_general_api))
        with self._family:
            self._families = {k: f for k, f in self._families.items() if f}  # closed families go
            family = self._families.setdefault(key, weakref.WeakSet())
            sibling = next((m for m in family if m.is_open), None)
            model = RknnrtModel(
                self._library, model_path, options, self._probe, self._plugins, self._plugin_dir,
                sibling, self._family,
            )  # fmt: skip
            family.add(model)
        return model

    def soc(self) -> str:
        return self._probe.soc

    def frequencies(self) -> tuple[FrequencyList, ...]:
        return read_frequencies(self._probe.root)

    @contextmanager
    def measuring(self, fix_freq: bool) -> Iterator[FrequencyOutcome]:
        """With fix_freq, CPU, NPU and DDR run at their highest frequency and are restored afterwards."""
        if not fix_freq:
            yield FrequencyOutcome(frequencies=self.frequencies())
            return
        with pinned_frequencies(self._probe.root) as outcome:
            yield outcome
