"""The `host` backend: ONNX Runtime on the CPU, a virtual board for people without hardware.

It stands in for any SoC. Its models (host_model.py) import onnx and onnxruntime, a tenth of a second
on a small board: they are imported when the first model opens, so a daemon starts without them
(select.host_backend checks that they are installed).
"""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rknn_proto import model_container
from rknn_proto.messages import FrequencyList
from rknn_server.board.platform import read_frequencies
from rknn_server.runtime.base import (
    Backend,
    BackendCapabilities,
    ModelFormatError,
    ModelRuntime,
    RuntimeOptions,
    VersionInfo,
)

if TYPE_CHECKING:
    from rknn_server.runtime.host_model import LoadedModel


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def concurrent_runs(threads: int) -> int:
    """How many sessions may compute at once: as many as fill the cores with `threads` each.

    More would oversubscribe: ONNX Runtime splits each operator into `threads` equal parts, and
    when one part's thread is descheduled the whole operator waits for it, so N sessions each
    running on all cores at once are slower together than taking turns.
    """
    return max(1, default_threads() // threads)


def run_gate(threads: int) -> AbstractContextManager[Any]:
    """What lets concurrent_runs(threads) sessions compute at once: a plain lock for one (taken and
    given back in C; a Semaphore's Python-level condition costs tens of microseconds a frame)."""
    runs = concurrent_runs(threads)
    return threading.Lock() if runs == 1 else threading.Semaphore(runs)


@dataclass
class _Loading:
    """The lock that one model file's first load holds, and how many opens wait on it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class ModelShelf:
    """The model files this process has open, one `LoadedModel` each, for as long as one of their
    sessions holds it (the last one's close frees it). Opens of one file wait for its first load;
    opens of other files do not."""

    def __init__(self, threads: int, remember_facts: bool) -> None:
        self._threads = threads
        self._remember_facts = remember_facts
        self._models: weakref.WeakValueDictionary[str, LoadedModel] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._loading: dict[str, _Loading] = {}

    def take(self, path: Path, budget: int) -> LoadedModel:
        """The file's loaded model, loaded now unless a session holds it already; each open checks
        its own session budget."""
        key = str(path)
        with self._lock:
            loading = self._loading.setdefault(key, _Loading())
            loading.users += 1
        try:
            with loading.lock:
                model = self._models.get(key)
                if model is None:
                    from rknn_server.runtime.host_model import LoadedModel

                    model = LoadedModel(path, self._threads, budget, self._remember_facts)
                    self._models[key] = model
                else:
                    model.check_budget(budget)
                return model
        finally:
            with self._lock:
                loading.users -= 1
                if not loading.users:
                    del self._loading[key]


class HostBackend(Backend):
    name = "host"
    model_suffixes = (".onnx",)
    capabilities = BackendCapabilities(
        perf_per_layer=True, memory_detail=True, layer_dumps=True, dynamic_shape=True
    )
    unpinned_reason = "the host runtime has no NPU and leaves the CPU to the OS"
    shares_models = True  # ModelShelf

    def __init__(
        self,
        soc: str = "",
        threads: int | None = None,
        sysfs_root: Path = Path("/"),
        remember_facts: bool = False,
    ) -> None:
        """`remember_facts`: the daemon's backend, whose models are files of its cache, beside which
        what a load learns of each model is kept for the next start (host_facts)."""
        self._soc = soc.lower()
        self.threads = threads or default_threads()
        self._sysfs_root = sysfs_root
        self.remember_facts = remember_facts
        # Shared by all sessions: at most concurrent_runs(threads) compute at once.
        self.gate = run_gate(self.threads)
        self.parallel_runs = concurrent_runs(self.threads)
        self.gated_runs = True
        self._shelf = ModelShelf(self.threads, self.remember_facts)

    def __getstate__(self) -> dict[str, object]:
        """Picklable for worker processes (--isolation process), each of which gets its own gate and
        its own models."""
        return {k: v for k, v in self.__dict__.items() if k not in ("gate", "_shelf")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.gate = run_gate(self.threads)
        self._shelf = ModelShelf(self.threads, self.remember_facts)

    def version(self) -> VersionInfo:
        from importlib import metadata

        import onnxruntime as ort  # imported by the first model or GetInfo, not at start

        return VersionInfo(
            api=f"onnxruntime {ort.__version__}", driver=f"host CPU (onnx {metadata.version('onnx')})"
        )

    def soc(self) -> str:
        return self._soc

    def frequencies(self) -> tuple[FrequencyList, ...]:
        """The CPU frequencies where cpufreq shows them: the only processor this runtime uses."""
        return tuple(reading for reading in read_frequencies(self._sysfs_root) if reading.kind == "CPU")

    def open(self, model_path: Path, options: RuntimeOptions) -> ModelRuntime:
        """A session of the model: every session of one file shares its one loaded copy."""
        from rknn_server.runtime.host_model import HostModel

        if not model_container.file_is_virtual(model_path) and (
            model_path.suffix.lower() == ".rknn" or _looks_like_rknn(model_path)
        ):
            raise ModelFormatError(
                f"{model_path.name} is an RKNN model, and this daemon runs the host runtime (ONNX Runtime), "
                "which cannot execute RKNN models. Run the daemon on the board with librknnrt "
                "(rknn_server --runtime rknnrt), or load the original model with load_onnx() to use the host runtime."
            )
        return HostModel(self._shelf.take(model_path, options.max_memory_bytes), options, self.gate)


def _looks_like_rknn(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"RKNN"
