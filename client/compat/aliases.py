"""The toolkit's import names (`rknn.api`, `rknnlite.api`, ...) resolved to this project for one process.

A meta-path finder answers only the names in ALIASES, with fresh module objects that forward attribute
look-ups to the project's module, and each alias is a package so that its submodules import too.
Nothing named `rknn` is installed: the finder exists while `rknn-client exec` runs a script, first on
sys.meta_path. Importing `rknn_client.compat.rknn` (what `from rknn_client import RKNN` does) adds a
fallback finder last, which answers only where nothing else does: a script that changed its one
import line still finds `rknn.utils.onnx_edit` and `rknn.api.custom_op`, and a real toolkit installed
in the same interpreter keeps its own names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

# toolkit module -> the rknn_client module that answers for it (None: an empty package).
ALIASES: dict[str, str | None] = {
    "rknn": None,
    "rknn.api": "rknn_client.compat.rknn",
    "rknn.api.custom_op": "rknn_client.compat.custom_op",
    "rknn.utils": "rknn_client.compat.onnx_edit",
    "rknn.utils._onnx_edit": "rknn_client.compat.onnx_edit",
    "rknnlite": None,
    "rknnlite.api": "rknn_client.compat.lite",
}


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        target = ALIASES[spec.name]
        if target is not None:
            real = importlib.import_module(target)
            names = getattr(real, "__all__", None) or [n for n in vars(real) if not n.startswith("_")]
            module.__dict__.update({name: getattr(real, name) for name in names})
            module.__doc__ = real.__doc__

            def forward(name: str) -> Any:
                return getattr(real, name)

            module.__getattr__ = forward  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Everything was set up in create_module."""


class ToolkitFinder(importlib.abc.MetaPathFinder):
    """Finds the toolkit's module names, and only those."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ALIASES:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(), is_package=True)
        spec.submodule_search_locations = []
        return spec


def install() -> ToolkitFinder:
    """Put the finder first on sys.meta_path (so an installed real toolkit does not answer instead)."""
    finder = ToolkitFinder()
    sys.meta_path.insert(0, finder)
    return finder


class FallbackFinder(ToolkitFinder):
    """The same names, asked last: only what no installed package provides."""


def install_fallback() -> None:
    """Add the fallback finder at the end of sys.meta_path, once per process."""
    if not any(isinstance(finder, FallbackFinder) for finder in sys.meta_path):
        sys.meta_path.append(FallbackFinder())


def uninstall(finder: ToolkitFinder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name in ALIASES:
        sys.modules.pop(name, None)
