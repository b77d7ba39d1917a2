"""The one exception accuracy analysis raises, so callers can turn bad input into a clear message."""

from __future__ import annotations


class AccuracyError(ValueError):
    """Bad input to quantization or accuracy analysis: missing file, wrong size, unwritable folder."""
