"""`--backend MODULE:CALLABLE`: serve with a Backend from outside this package.

The hook for out-of-tree runtimes and for tests that need a runtime which misbehaves on purpose
(hangs, crashes). CALLABLE is called with no arguments and must return a Backend; with
`--isolation process` the backend must be picklable (it is rebuilt in each session's worker).
"""

from __future__ import annotations

import importlib

from rknn_server.runtime.base import Backend
from rknn_server.runtime.select import BackendUnavailable


def load_backend(spec: str) -> Backend:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise BackendUnavailable(f"--backend {spec!r}: expected MODULE:CALLABLE")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(f"--backend {spec!r} cannot be loaded: {exc}") from exc
    backend = factory()
    if not isinstance(backend, Backend):
        raise BackendUnavailable(f"--backend {spec!r} returned {type(backend).__name__}, not a Backend")
    return backend
