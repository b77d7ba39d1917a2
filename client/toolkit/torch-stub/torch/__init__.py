"""NOT PyTorch: rknn-client's stand-in, installed only by `rknn-client toolkit install --torch-stub`.

`rknn.api` imports torch at import time and uses just `torch.nn.Module` (as a base class) and
`torch.no_grad()` (as a decorator), and 2.3.2 also `torch.Tensor` (in annotations), until a PyTorch model is loaded. The PyPI torch wheel needs
gigabytes of CUDA libraries merely to import, so tests may install this instead: ONNX, TFLite, Caffe
and Darknet conversion, build, export and the simulator work; anything that really needs torch
(load_pytorch: its converter's torch.arange and the like) fails with the message below; see
rknn_client.toolkit.install.TORCH_STUB_LIMITS for what was checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__version__ = "2.4.0+rknn.client.stub"
STUB_NOTE = (
    "this environment has rknn-client's stand-in for torch (toolkit installed with --torch-stub), "
    "not PyTorch (load_pytorch needs it); reinstall with `rknn-client toolkit install` (without --torch-stub) to use it"
)


class no_grad:
    """Decorator / context manager that does nothing (there are no tensors to track)."""

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    def __enter__(self) -> no_grad:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Tensor:
    """Only a name for annotations: no tensor is ever made from it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(STUB_NOTE)


def __getattr__(name: str) -> Any:
    raise AttributeError(f"torch.{name}: {STUB_NOTE}")
