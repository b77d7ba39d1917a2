"""The two error measures of the toolkit's table, computed in float64 over the flattened tensors.

    cos(a, b) = sum(a_i * b_i) / (sqrt(sum(a_i^2)) * sqrt(sum(b_i^2)))   (1.0 when both are all zero,
                                                                          0.0 when only one is)
    euc(a, b) = sqrt(sum((a_i - b_i)^2))                                  (not normalised)

`align` decides whether two tensors of one layer can be compared at all: same shape, a 4-D tensor
that a board delivered in NHWC while the reference is NCHW (a shape that reads the same both ways,
C == H == W, is taken as NCHW), or the same values with extra axes of size 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ErrorPair:
    """One `cos | euc` cell pair of the table."""

    cos: float
    euc: float


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of the flattened tensors, in float64."""
    x = np.asarray(a, np.float64).ravel()
    y = np.asarray(b, np.float64).ravel()
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    if norm == 0.0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return float(np.dot(x, y) / norm)


def euclidean(a: np.ndarray, b: np.ndarray) -> float:
    """Euclidean distance of the flattened tensors, in float64."""
    return float(np.linalg.norm(np.asarray(a, np.float64).ravel() - np.asarray(b, np.float64).ravel()))


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
    return ErrorPair(cosine(reference, aligned), euclidean(reference, aligned))
