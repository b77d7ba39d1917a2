"""How close a device's output is to the reference's."""

from __future__ import annotations

import numpy as np


def cosine_similarity(output: np.ndarray, reference: np.ndarray) -> float:
    """Cosine of the angle between the two tensors as flat vectors.

    1.0 means the same direction; two all-zero tensors agree (1.0); one all-zero tensor against a
    non-zero one does not (0.0); tensors of different sizes cannot agree (0.0).
    """
    a = np.asarray(output, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    if a.size != b.size:
        return 0.0
    norm_a = float(np.linalg.norm(a))
    norm_b = float(np.linalg.norm(b))
    if norm_a == 0.0 and norm_b == 0.0:
        return 1.0
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return float(np.dot(a, b) / (norm_a * norm_b))
