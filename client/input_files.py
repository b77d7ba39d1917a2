"""Input files as the CLI takes them: `.npy`, `.npz` and images (jpg/png/bmp).

Images follow the toolkit's rules: read as RGB (or grey for a one-channel input), laid out NHWC with a
batch axis, uint8, and resized to the model input's height and width with a note saying so. The
toolkit's layout and dtype rules then apply as for `RKNN.inference` (rknn_client.compat.inputs).
With OpenCV installed (the client extra brings it, as RKNN-Toolkit2 does) images are decoded and resized
by it, as toolkit scripts do (cv2.imread, cvtColor to RGB, cv2.resize), so the pixels are the toolkit's;
without it Pillow decodes and resize_linear resizes (values may differ by one level).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp"})
PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
Note = Callable[[str], None]


class InputFileError(ValueError):
    """An input file that is missing, unreadable or cannot fit the model."""


def image_size(shape: Sequence[int], layout: str) -> tuple[int, int, int] | None:
    """(height, width, channels) an image for a 4-D input of `shape` must have; None when not 4-D."""
    if len(shape) != 4:
        return None
    if layout.upper() == "NHWC":
        return shape[1], shape[2], shape[3]
    return shape[2], shape[3], shape[1]


def _axis_weights(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's INTER_LINEAR sampling along one axis: pixel centres aligned (src = (dst + 0.5) * in / out
    - 0.5), clamped at the borders; the lower neighbour, the upper one and the upper one's weight."""
    position = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    position = np.clip(position, 0.0, size_in - 1)
    low = np.floor(position).astype(np.intp)
    high = np.minimum(low + 1, size_in - 1)
    return low, high, (position - low)


def resize_linear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """An HWC uint8 image resized as cv2.resize(..., interpolation=INTER_LINEAR) maps pixels.

    The toolkit resizes with OpenCV. Pillow's BILINEAR filter widens its support when shrinking (an
    antialiasing filter), so it gives other values than OpenCV on downscaled images; this is the plain
    two-tap interpolation OpenCV does. OpenCV computes uint8 images in 11-bit fixed point, so its values
    may differ from these by one level.
    """
    rows_low, rows_high, row_weight = _axis_weights(pixels.shape[0], height)
    cols_low, cols_high, col_weight = _axis_weights(pixels.shape[1], width)
    data = pixels.astype(np.float64)
    top = data[rows_low] * (1 - row_weight)[:, None, None] + data[rows_high] * row_weight[:, None, None]
    both = top[:, cols_low] * (1 - col_weight)[None, :, None] + top[:, cols_high] * col_weight[None, :, None]
    return np.clip(np.rint(both), 0, 255).astype(np.uint8)


def _opencv() -> ModuleType | None:
    try:
        return importlib.import_module("cv2")
    except ImportError:
        return None


def _decode_opencv(cv2: ModuleType, path: Path, channels: int) -> np.ndarray:
    """cv2.imread's pixels (it cannot take every path: decoded from the bytes), in RGB order."""
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise InputFileError(f"cannot read image {path}: {exc}") from exc
    flag = {1: cv2.IMREAD_GRAYSCALE, 3: cv2.IMREAD_COLOR}.get(channels, cv2.IMREAD_UNCHANGED)
    pixels = cv2.imdecode(data, flag) if data.size else None
    if pixels is None:
        raise InputFileError(f"cannot read image {path}: OpenCV cannot decode it")
    pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], -1)
    if pixels.shape[2] != channels:
        raise InputFileError(f"{path} has {pixels.shape[2]} channels; the model input takes {channels}")
    if channels in (3, 4):
        return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGRA2RGBA)
    return pixels


def _decode_pillow(path: Path, mode: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert(mode))
    except Exception as exc:  # Pillow raises OSError, SyntaxError or its DecompressionBombError
        raise InputFileError(f"cannot read image {path}: {exc}") from exc
    return pixels.reshape(pixels.shape[0], pixels.shape[1], -1)


def read_image(path: Path, size: tuple[int, int, int] | None, note: Note) -> np.ndarray:
    """An image as HxWxC uint8, resized to `size` (height, width, channels) when that is known."""
    channels = size[2] if size is not None else 3
    mode = PIL_MODES.get(channels)
    if mode is None:
        raise InputFileError(f"{path}: an image cannot feed an input with {channels} channels; use .npy")
    cv2 = _opencv()
    pixels = _decode_opencv(cv2, path, channels) if cv2 is not None else _decode_pillow(path, mode)
    if size is not None and size[0] > 0 and size[1] > 0 and pixels.shape[:2] != (size[0], size[1]):
        note(
            f"{path}: resized from {pixels.shape[1]}x{pixels.shape[0]} to the model input's "
            f"{size[1]}x{size[0]} (WxH)"
        )
        if cv2 is not None:
            resized = cv2.resize(pixels, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
            pixels = resized.reshape(size[0], size[1], -1)
        else:
            pixels = resize_linear(pixels, size[0], size[1])
    return pixels


# The first bytes of each kind of file an input can be, so that a misnamed file is read as what it is.
MAGIC = {
    b"\x93NUMPY": ".npy",
    b"PK\x03\x04": ".npz",
    b"\x89PNG\r\n\x1a\n": ".png",
    b"\xff\xd8\xff": ".jpg",
    b"BM": ".bmp",
}


def sniff(path: Path) -> str | None:
    """The suffix the file's content says it has (".npy", ".png", ...); None when unknown."""
    try:
        with path.open("rb") as file:
            head = file.read(8)
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from exc
    return next((suffix for magic, suffix in MAGIC.items() if head.startswith(magic)), None)


def _read_arrays(path: Path) -> list[np.ndarray]:
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                return [archive[name] for name in archive.files]
        return [np.load(path, allow_pickle=False)]
    except (OSError, ValueError) as exc:
        raise InputFileError(f"cannot read {path} as {path.suffix.lower()[1:]}: {exc}") from exc


def check_input_files(paths: Sequence[str | Path]) -> None:
    """Refuse a missing file before any work starts (an upload can take a while)."""
    for text in paths:
        if not Path(text).is_file():
            raise InputFileError(f"no such input file: {text}")


def read_input_files(
    paths: Sequence[str | Path],
    sizes: Sequence[tuple[int, int, int] | None],
    note: Note,
) -> list[np.ndarray]:
    """The arrays the files hold, in order: one per .npy or image, every array of a .npz (in the order
    stored). `sizes[i]` is the image size model input i wants (None: not an image input)."""
    check_input_files(paths)
    arrays: list[np.ndarray] = []
    for text in paths:
        path = Path(text)
        suffix = path.suffix.lower()
        if suffix in (".npy", ".npz"):
            suffix = _content_suffix(path, suffix, note)
        if suffix in (".npy", ".npz"):
            arrays += _read_arrays(path)
        elif suffix in IMAGE_SUFFIXES:
            size = sizes[len(arrays)] if len(arrays) < len(sizes) else None
            arrays.append(read_image(path, size, note)[np.newaxis])
        else:
            raise InputFileError(
                f"{path}: unsupported input file type {suffix or '(none)'}; use .npy, .npz, "
                "or an image (jpg, png, bmp)"
            )
    return arrays


def _content_suffix(path: Path, suffix: str, note: Note) -> str:
    """The suffix `path`'s content has: `suffix` when it fits, another kind's (with a note) when the
    file is misnamed; refused when it is no input file at all."""
    found = sniff(path)
    if found is None:
        raise InputFileError(
            f"cannot read {path} as {suffix}: its content is neither a .npy nor a .npz array nor an "
            "image (jpg, png, bmp)"
        )
    if found != suffix:
        kind = "image" if found in IMAGE_SUFFIXES else "array"
        note(f"{path} is a {found[1:].upper()} {kind}, not {suffix}: read as one (rename it to {found})")
    return found
