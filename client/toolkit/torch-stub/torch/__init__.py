"""NOT PyTorch: rknn-client's stand-in, installed only by `rknn-client toolkit install --torch-stub`.

`rknn.api` imports torch at import time and uses just `torch.nn.Module` (as a base class) and
`torch.no_grad()` (as a decorator), and 2.3.2 also `torch.Tensor` (in annotations), until a PyTorch
model is loaded. One graph rule of build (reduce_reshape_op_around_concat, which the official
onnx_edit example's model meets) computes an index map with `torch.arange(n).reshape(shape)`,
`torch.split`, `torch.cat`, `.reshape` and `.tolist()`: those few are numpy underneath here. The PyPI
torch wheel needs gigabytes of CUDA libraries merely to import, so tests may install this instead:
ONNX, TFLite, Caffe and Darknet conversion, build, export and the simulator work; anything else that
really needs torch (load_pytorch's converter) fails with the message below; see
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
    """A name for annotations, and a numpy array behind the index-map calls above; only `arange`,
    `split` and `cat` make one."""

    _array: Any  # the numpy array

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(STUB_NOTE)

    @classmethod
    def _of(cls, array: Any) -> Tensor:
        made = object.__new__(cls)
        made._array = array
        return made

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    def reshape(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return Tensor._of(self._array.reshape(shape))

    def tolist(self) -> Any:
        return self._array.tolist()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"Tensor.{name}: {STUB_NOTE}")


def arange(*args: Any, **kwargs: Any) -> Tensor:
    import numpy

    return Tensor._of(numpy.arange(*args))


def split(tensor: Tensor, split_size_or_sections: int | list[int], dim: int = 0) -> tuple[Tensor, ...]:
    """torch.split: pieces of `split_size_or_sections` each (an int), or of the listed sizes."""
    import numpy

    length = tensor.shape[dim]
    if isinstance(split_size_or_sections, int):
        sizes = [split_size_or_sections] * (length // split_size_or_sections)
        sizes += [length % split_size_or_sections] if length % split_size_or_sections else []
    else:
        sizes = list(split_size_or_sections)
    cuts = list(numpy.cumsum(sizes)[:-1])
    return tuple(Tensor._of(piece) for piece in numpy.split(tensor._array, cuts, axis=dim))


def cat(tensors: Any, dim: int = 0) -> Tensor:
    import numpy

    return Tensor._of(numpy.concatenate([t._array for t in tensors], axis=dim))


def __getattr__(name: str) -> Any:
    raise AttributeError(f"torch.{name}: {STUB_NOTE}")
