"""The stand-in's torch.nn: a Module base class the toolkit subclasses at import time, nothing more."""

from __future__ import annotations

from typing import Any

from torch import STUB_NOTE


class Module:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"torch.nn.Module: {STUB_NOTE}")


def __getattr__(name: str) -> Any:
    raise AttributeError(f"torch.nn.{name}: {STUB_NOTE}")
