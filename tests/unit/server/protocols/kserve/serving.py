"""V2Models over a data plane of its own, for the in-process tests of this folder: a repository of one
model `m`, made by `make`."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rknn_proto import codec
from rknn_server.config.limits import CacheLimits, SessionLimits
from rknn_server.core.data_plane import DataPlane
from rknn_server.observe.metrics import DaemonMetrics
from rknn_server.protocols.kserve.models import V2Models
from rknn_server.protocols.kserve.repository import ModelRepository
from rknn_server.runtime.base import Backend
from rknn_server.store.model_cache import ModelCache
from tests.models import identity_of


def tiny_identity(path: Path) -> Path:
    return identity_of(path, "float32", (1, 4))


def models_of(
    tmp_path: Path,
    executor: ThreadPoolExecutor,
    backend: Backend,
    max_sessions: int = 64,
    make: Callable[[Path], Path] = tiny_identity,
) -> V2Models:
    folder = tmp_path / "repository" / "m"
    folder.mkdir(parents=True, exist_ok=True)
    make(folder / "model.onnx")
    plane = DataPlane(
        backend,
        ModelCache(tmp_path / "cache", CacheLimits()),
        executor,
        DaemonMetrics(),
        codec.TensorLimits(),
        SessionLimits(max_sessions=max_sessions),
    )
    repository = ModelRepository(tmp_path / "repository", backend.model_suffixes, CacheLimits.max_model_bytes)
    return V2Models(plane, repository, max_cached_sessions=8)
