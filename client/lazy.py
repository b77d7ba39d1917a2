"""Package attributes imported at first use (PEP 562), so importing a package stays light.

`import rknn_client` (and the pytest plugin under rknn_client.farm) must work in a `[server]`-only
install, where onnx and the other client dependencies are absent: the package's exports import them
only when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` resolving each name in `exports` from the module it maps to."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
