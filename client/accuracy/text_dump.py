"""A tensor as text, one value per line, in RKNN-Toolkit2's precision, fast.

Each value is the toolkit's `%.6f` (integers `%d`) without the zeros that end its fraction: `0`, `0.5`,
`-1.25`. The numbers read back are the toolkit's, and the files are smaller where it matters most (a
ReLU layer is mostly zeros: `0` is 2 bytes, `0.000000` 9).

`ndarray.tofile(sep="\\n", format=...)` formats every value through Python (about 1 µs each): that was
two thirds of an accuracy analysis of MobileNetV2, whose layers hold millions of values. Here the
digits are computed with integer arithmetic on whole columns, then the bytes to keep are gathered, so
a value costs a few byte operations. Values this cannot write exactly as printf would (not finite, or
too large for 64-bit fixed point) take the general path for that chunk.

For float32 (and float16) input the digits are printf's: `x * 10**6` is exact in float64 (24 + 20
significant bits), and `rint` rounds ties to even as glibc's printf does on exact ties.
"""

from __future__ import annotations

from typing import IO

import numpy as np

DECIMALS = 6
CHUNK = 1 << 20  # values per chunk: bounds the byte matrix to a few tens of MB
_LIMIT = 2.0**62  # scaled magnitudes below this fit uint64 with room for the rounding


def write_lines(out: IO[bytes], values: np.ndarray) -> None:
    """Write every value of `values` (flattened, C order) followed by a newline."""
    flat = values.reshape(-1)
    decimals = DECIMALS if np.issubdtype(flat.dtype, np.floating) else 0
    for start in range(0, flat.size, CHUNK):
        out.write(_chunk_text(flat[start : start + CHUNK], decimals))


def _chunk_text(values: np.ndarray, decimals: int) -> bytes:
    negative = np.signbit(values) if decimals else values < 0
    if decimals:
        scaled_f = np.rint(np.abs(values.astype(np.float64)) * 10.0**decimals)
        if not np.isfinite(scaled_f).all() or (scaled_f >= _LIMIT).any():
            return _printf(values, f"%.{decimals}f")
        scaled = scaled_f.astype(np.uint64)
    else:
        wide = values.astype(np.int64)
        if wide.size and wide.min() == np.iinfo(np.int64).min:
            return _printf(values, "%d")
        scaled = np.abs(wide).astype(np.uint64)
    if not scaled.size:
        return b""
    digits = max(len(str(int(scaled.max()))), decimals + 1)
    if digits <= 9:  # 32-bit division is several times faster than 64-bit
        scaled = scaled.astype(np.uint32)
    # Rows of `text` are the columns of the output: sign, the digits (the point before the last
    # `decimals`), newline; built one contiguous row at a time, transposed once at the end.
    point = 1 if decimals else 0
    width = 1 + digits + point + 1
    text = np.empty((width, scaled.size), np.uint8)
    text[0] = ord("-")
    text[-1] = ord("\n")
    if point:
        text[width - 2 - decimals] = ord(".")
    length = np.ones(scaled.size, np.uint8)  # how many digits each value has
    trailing = np.zeros(scaled.size, np.uint8)  # zeros ending the fraction
    zeros_so_far = np.ones(scaled.size, bool)
    remaining, digit = scaled.copy(), np.empty_like(scaled)
    ten = scaled.dtype.type(10)
    for place in range(digits):
        np.divmod(remaining, ten, out=(remaining, digit))
        row = width - 2 - place - (point if place >= decimals else 0)
        text[row] = digit
        text[row] += ord("0")
        length += remaining > 0
        if place < decimals:
            zeros_so_far &= digit == 0
            trailing += zeros_so_far
    np.maximum(length, decimals + 1, out=length)  # at least one digit before the point
    trailing[trailing == decimals] += point  # no decimals left: the point goes too
    columns = np.arange(width, dtype=np.uint8)[None, :]
    first = (width - 1 - point) - length  # each value's leading-digit column (uint8: a cheap mask)
    last = (width - 2) - trailing
    keep = (columns >= first[:, None]) & (columns <= last[:, None])
    keep[:, 0] = negative
    keep[:, -1] = True
    return np.ascontiguousarray(text.T)[keep].tobytes()


def _printf(values: np.ndarray, fmt: str) -> bytes:
    """The slow, general way, for chunks with values the fixed-point path cannot write."""
    if not values.size:
        return b""
    return ("\n".join(trimmed(fmt % value) for value in values.tolist()) + "\n").encode()


def trimmed(text: str) -> str:
    """A printf result without the zeros that end its fraction (and the point they leave bare)."""
    return text.rstrip("0").rstrip(".") if "." in text else text
