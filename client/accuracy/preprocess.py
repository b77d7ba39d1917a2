"""The toolkit's input contract: mean/std baked into the model, and input files read into arrays.

`config(mean_values, std_values)` means: subtract the mean, then divide by the std, per channel, no
channel swap. Baking that into the ONNX model as `Sub` and `Div` at the front makes the model's input the
raw image (NCHW float32 for ONNX models), so golden, simulator and runtime all take the same data.
Image files (jpg/png/bmp) are read as the toolkit reads them with OpenCV: RGB (OpenCV's BGR read, then
converted), or BGR with `quant_img_RGB2BGR`; one of another size is resized to the input's height and
width with OpenCV's INTER_LINEAR mapping and a warning on the `rknn_client.accuracy` logger
(rknn_client.input_files, the rule `rknn-client run` follows too). They are handed to the model as NCHW
with a batch axis. `.npy` files (and a `.npz` holding one array, or one named like the
input) are used as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rknn_client.accuracy.capture import graph_inputs
from rknn_client.accuracy.errors import AccuracyError
from rknn_client.input_files import IMAGE_SUFFIXES, PIL_MODES, InputFileError, read_image

Channels = Sequence[float]


@dataclass(frozen=True)
class InputSpec:
    """A model input: name, shape (None for a dynamic dimension) and numpy dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's inputs in order."""
    specs = []
    for info in graph_inputs(model.graph):
        tensor_type = info.type.tensor_type
        shape = tuple(dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        specs.append(InputSpec(info.name, shape, dtype))
    return specs


def _channel_constant(values: Channels, spec: InputSpec, what: str) -> np.ndarray:
    """Per-channel values shaped to broadcast over axis 1 (NCHW), or a scalar for one value."""
    array = np.asarray(values, np.float32).ravel()
    if array.size == 1:
        return array.reshape(())
    channels = spec.shape[1] if len(spec.shape) > 1 else None
    if channels is not None and channels != array.size:
        raise AccuracyError(
            f"{what} for input {spec.name} has {array.size} values, the input has {channels} channels"
        )
    return array.reshape([1, array.size] + [1] * max(len(spec.shape) - 2, 0))


def bake_normalization(
    model: onnx.ModelProto, mean: Sequence[Channels] | None, std: Sequence[Channels] | None
) -> onnx.ModelProto:
    """A copy of `model` computing `(x - mean) / std` on each input first (a list per input)."""
    specs = input_specs(model)
    for what, given in (("mean_values", mean), ("std_values", std)):
        if given is not None and len(given) != len(specs):
            raise AccuracyError(f"{what} has {len(given)} entries, the model has {len(specs)} inputs")
    baked = onnx.ModelProto()
    baked.CopyFrom(model)
    front: list[onnx.NodeProto] = []
    for position, spec in enumerate(specs):
        mean_c = _channel_constant(mean[position], spec, "mean_values") if mean is not None else np.float32(0)
        std_c = _channel_constant(std[position], spec, "std_values") if std is not None else np.float32(1)
        if not np.any(mean_c) and np.all(std_c == 1):
            continue
        if not np.all(std_c):
            raise AccuracyError(f"std_values for input {spec.name} contain 0")
        centred, scaled = f"{spec.name}_mean_sub", f"{spec.name}_std_div"
        for node in baked.graph.node:
            for index, name in enumerate(node.input):
                if name == spec.name:
                    node.input[index] = scaled
        for output in baked.graph.output:
            if output.name == spec.name:
                raise AccuracyError(f"input {spec.name} is also a graph output; cannot bake mean/std into it")
        baked.graph.initializer.extend(
            [
                onnx.numpy_helper.from_array(np.asarray(mean_c, np.float32), f"{spec.name}_mean"),
                onnx.numpy_helper.from_array(np.asarray(std_c, np.float32), f"{spec.name}_std"),
            ]
        )
        front.append(onnx.helper.make_node("Sub", [spec.name, f"{spec.name}_mean"], [centred], name=centred))
        front.append(onnx.helper.make_node("Div", [centred, f"{spec.name}_std"], [scaled], name=scaled))
    nodes = [*front, *baked.graph.node]
    del baked.graph.node[:]
    baked.graph.node.extend(nodes)
    return baked


LOG = logging.getLogger("rknn_client.accuracy")


def _read_image(path: Path, spec: InputSpec, rgb2bgr: bool = False) -> np.ndarray:
    """An image file as a 1xCxHxW array of the model's dtype, resized to the model's size."""
    if len(spec.shape) != 4 or spec.shape[1] not in PIL_MODES:
        raise AccuracyError(f"input {spec.name} (shape {spec.shape}) is not an NCHW image input; use .npy")
    size = (spec.shape[2] or 0, spec.shape[3] or 0, spec.shape[1])
    try:
        pixels = read_image(path, size, LOG.warning)
    except InputFileError as exc:
        raise AccuracyError(str(exc)) from exc
    if rgb2bgr and pixels.shape[2] >= 3:
        pixels = pixels[:, :, [2, 1, 0, *range(3, pixels.shape[2])]]
    return pixels.transpose(2, 0, 1)[np.newaxis].astype(spec.dtype)


def _read_npy(path: Path, spec: InputSpec) -> np.ndarray:
    """A .npy file (or a .npz's one array, or its array named like the input); its shape must fit the
    model input, and it is cast to the input's dtype as the toolkit does (numpy writes float64 unless
    told otherwise)."""
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                names = archive.files
                if spec.name not in names and len(names) != 1:
                    raise AccuracyError(
                        f"{path} holds {len(names)} arrays ({', '.join(names)}) and none named "
                        f"{spec.name}; give one .npz per input, or name its array like the input"
                    )
                array = archive[spec.name if spec.name in names else names[0]]
        else:
            array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise AccuracyError(f"cannot read {path}: {exc}") from exc
    fits = len(array.shape) == len(spec.shape) and all(
        want is None or want == got for want, got in zip(spec.shape, array.shape, strict=True)
    )
    if not fits:
        raise AccuracyError(f"{path} has shape {array.shape}, input {spec.name} needs {spec.shape}")
    return array.astype(spec.dtype, copy=False)


def load_input(path: str | Path, spec: InputSpec, rgb2bgr: bool = False) -> np.ndarray:
    """Read one input file for one model input; `rgb2bgr` is config(quant_img_RGB2BGR=True)."""
    file = Path(path)
    if not file.is_file():
        raise AccuracyError(f"no such input file: {file}")
    suffix = file.suffix.lower()
    if suffix in (".npy", ".npz"):
        return _read_npy(file, spec)
    if suffix in IMAGE_SUFFIXES:
        return _read_image(file, spec, rgb2bgr)
    raise AccuracyError(f"{file}: unsupported input file type (use jpg, png, bmp, npy or npz)")


def load_inputs(
    paths: Sequence[str | Path], specs: Sequence[InputSpec], rgb2bgr: bool = False
) -> dict[str, np.ndarray]:
    """One file per model input, in the model's input order."""
    if len(paths) != len(specs):
        raise AccuracyError(f"{len(paths)} input file(s) given, the model has {len(specs)} input(s)")
    return {spec.name: load_input(path, spec, rgb2bgr) for path, spec in zip(paths, specs, strict=True)}


def read_dataset(dataset_txt: str | Path) -> list[list[Path]]:
    """dataset.txt: a sample per line, a path per model input (space separated), relative to its folder."""
    listing = Path(dataset_txt)
    try:
        lines = listing.read_text().splitlines()
    except OSError as exc:
        raise AccuracyError(f"cannot read dataset file {listing}: {exc}") from exc
    samples = [[listing.parent / part for part in line.split()] for line in lines if line.strip()]
    if not samples:
        raise AccuracyError(f"dataset file {listing} lists no inputs")
    return samples
