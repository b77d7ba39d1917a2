"""What one frame is: its input arrays and how the daemon is to read them, as one value.

A frame's callers (the toolkit-compatible `inference`, a load test's request, the CLI's --input files,
a pipeline's `submit`) hand on one `FrameSpec` instead of the same four arguments through every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FrameSpec:
    """One frame's inputs. `layouts` names the layout of each 4-D input given in another than the
    model's own (the daemon converts it); `pass_through` marks inputs the runtime takes as they are
    (no conversion, no quantization); `strict=False` leaves the dtype check to the daemon's intake
    (which checks shapes always)."""

    arrays: Sequence[np.ndarray]
    layouts: Sequence[str] | None = None
    pass_through: Sequence[bool] | None = None
    strict: bool = True

    def signature(self, native_outputs: bool) -> tuple[object, ...] | None:
        """All that the frame's checks and header depend on: each input's dtype (with its byte order),
        shape and whether it is C-contiguous, and the frame's options. None for inputs that are not
        plain ndarrays (checked, and described, afresh every time)."""
        arrays = self.arrays
        if not all([type(a) is np.ndarray for a in arrays]):
            return None
        return (
            tuple([(a.dtype, a.shape, a.flags.c_contiguous) for a in arrays]),
            None if self.layouts is None else tuple(self.layouts),
            None if self.pass_through is None else tuple(self.pass_through),
            self.strict,
            native_outputs,
        )
