"""The two error measures of the toolkit's table, computed in float64 over the flattened tensors.

    cos(a, b) = sum(a_i * b_i) / (sqrt(sum(a_i^2)) * sqrt(sum(b_i^2)))   (1.0 when both are all zero,
                                                                          0.0 when only one is)
    euc(a, b) = sqrt(sum((a_i - b_i)^2))                                  (not normalised)

`align` decides whether two tensors of one layer can be compared at all: same shape, a 4-D tensor
that a board delivered in NHWC while the reference is NCHW (a shape that reads the same both ways,
C == H == W, is taken as NCHW), or the same values with extra axes of size 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ErrorPair:
    """One `cos | euc` cell pair of the table."""

    cos: float
    euc: float


def _flat64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64).ravel()


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """sum(x_i * y_i), one pass and no BLAS threads (which contend on a busy machine)."""
    return float(np.einsum("i,i->", x, y))


def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    norm = math.sqrt(_dot(x, x) * _dot(y, y))
    if norm == 0.0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return _dot(x, y) / norm


def _euclidean(x: np.ndarray, y: np.ndarray) -> float:
    difference = x - y
    return math.sqrt(_dot(difference, difference))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of the flattened tensors, in float64."""
    return _cosine(_flat64(a), _flat64(b))


def euclidean(a: np.ndarray, b: np.ndarray) -> float:
    """Euclidean distance of the flattened tensors, in float64."""
    return _euclidean(_flat64(a), _flat64(b))


def align(reference: np.ndarray, other: np.ndarray) -> np.ndarray | None:
    """`other` in the reference's layout, or None when the two cannot be the same tensor."""
    if other.shape == reference.shape:
        return other
    if other.ndim == 4 and reference.ndim == 4 and other.transpose(0, 3, 1, 2).shape == reference.shape:
        return other.transpose(0, 3, 1, 2)
    if other.size == reference.size and np.squeeze(other).shape == np.squeeze(reference).shape:
        return other.reshape(reference.shape)
    return None


def compare(reference: np.ndarray, other: np.ndarray) -> ErrorPair | None:
    """Both measures, or None when the tensors do not line up."""
    aligned = align(reference, other)
    if aligned is None:
        return None
    x, y = _flat64(reference), _flat64(aligned)  # each converted once for both measures
    return ErrorPair(_cosine(x, y), _euclidean(x, y))
