"""`rknn.utils.onnx_edit`: reshape/transpose a model's inputs and outputs by a symbolic equation.

An equation `a,b,c,d->1,ad,b,c` says: the tensor's dimensions are named (left), and the edited model
sees them regrouped and reordered (right). Rules (the toolkit's documented ones): groups are split by
`,`; a group is letters a-z or `1`; a letter names one factor, letters side by side multiply
(`ab` = a*b); `[a=2,k=8]` after the left side fixes factors, and one unknown per group is inferred;
every left letter appears exactly once on the right; `1` on the right adds a dimension of size 1.
For an input, the edited model takes the right-hand shape and turns it back into the original with
Reshape -> Transpose -> Reshape at its front; for an output, the same ops at its end produce the
right-hand shape. With `dataset`, every .npy listed for a transformed input is transformed the same
way and, as the toolkit does, a new dataset file is written beside `export_path`:
`dataset_for_<export stem>.txt`, listing the transformed files (and copies of the other inputs'
.npy files) in `dataset_for_<export stem>/`.
Dynamic dimensions are not supported here (the toolkit supports some; this says so and returns -1).
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rknn_client.compat.toolkit_log import ToolkitLog

_EQUATION = re.compile(
    r"^\s*(?P<left>[a-z1,\s]+?)\s*(\[(?P<fix>[^\]]*)\])?\s*->\s*(?P<right>[a-z1,\s]+?)\s*$"
)


class EditError(ValueError):
    """An equation or model the edit cannot apply; the message says what is wrong."""


@dataclass(frozen=True)
class Transform:
    """One tensor's transform: its original shape, the named factors and the new shape."""

    original: tuple[int, ...]
    left_letters: tuple[str, ...]
    right_letters: tuple[str, ...]
    sizes: dict[str, int]
    new_shape: tuple[int, ...]

    @property
    def factors_left(self) -> list[int]:
        return [self.sizes[letter] for letter in self.left_letters]

    @property
    def factors_right(self) -> list[int]:
        return [self.sizes[letter] for letter in self.right_letters]

    @property
    def to_new(self) -> list[int]:
        """Transpose permutation from the left letter order to the right one."""
        return [self.left_letters.index(letter) for letter in self.right_letters]

    @property
    def to_original(self) -> list[int]:
        return [self.right_letters.index(letter) for letter in self.left_letters]

    def apply(self, array: np.ndarray) -> np.ndarray:
        """Data in the original shape, rearranged into the new shape."""
        split = np.reshape(array, self.factors_left)
        return np.ascontiguousarray(np.transpose(split, self.to_new)).reshape(self.new_shape)


def _groups(text: str) -> list[str]:
    return [group.strip() for group in text.split(",") if group.strip()]


def parse(equation: str, shape: tuple[int, ...]) -> Transform:
    """The transform an equation describes for a tensor of `shape`."""
    match = _EQUATION.match(equation)
    if match is None:
        raise EditError(
            f"{equation!r} is not 'dims->dims' with groups of a-z or 1 (and [x=N,...] after the left)"
        )
    left, right = _groups(match["left"]), _groups(match["right"])
    if len(left) != len(shape):
        raise EditError(
            f"{equation!r} names {len(left)} dimension(s), the tensor has {len(shape)}: {list(shape)}"
        )
    if any(d <= 0 for d in shape):
        raise EditError(
            f"the tensor's shape {list(shape)} has dynamic dimensions, which this edit does not support"
        )
    sizes: dict[str, int] = {}
    for item in _groups(match["fix"] or ""):
        name, _, value = item.partition("=")
        if not re.fullmatch(r"[a-z]", name.strip()) or not value.strip().isdigit() or int(value) <= 0:
            raise EditError(f"assignment {item!r} is not letter=positive integer")
        sizes[name.strip()] = int(value)
    left_letters: list[str] = []
    for group, dim in zip(left, shape, strict=True):
        if group == "1":
            if dim != 1:
                raise EditError(f"'1' stands for a dimension of {dim} in {equation!r}")
            continue
        if "1" in group:
            raise EditError(f"group {group!r} mixes '1' with letters")
        unknown = [letter for letter in group if letter not in sizes]
        known = math.prod(sizes[letter] for letter in group if letter in sizes)
        if len(unknown) > 1:
            raise EditError(f"group {group!r} of size {dim} has several unknown factors; fix them with [x=N]")
        if unknown:
            if dim % known:
                raise EditError(f"group {group!r}: {dim} is not divisible by {known}")
            sizes[unknown[0]] = dim // known
        elif known != dim:
            raise EditError(f"group {group!r} multiplies to {known}, the dimension is {dim}")
        left_letters.extend(group)
    if len(set(left_letters)) != len(left_letters):
        raise EditError(f"a letter appears twice on the left of {equation!r}")
    right_letters = [letter for group in right for letter in group if letter != "1"]
    if sorted(right_letters) != sorted(left_letters):
        raise EditError(f"the right of {equation!r} must use each left letter exactly once")
    new_shape = tuple(
        1 if group == "1" else math.prod(sizes[c] for c in group if c != "1") for group in right
    )
    return Transform(tuple(shape), tuple(left_letters), tuple(right_letters), sizes, new_shape)


def _static_shape(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in info.type.tensor_type.shape.dim)


def _set_shape(info: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    dims = info.type.tensor_type.shape.dim
    del dims[:]
    for d in shape:
        dims.add().dim_value = d


def _chain(
    source: str, target: str, first: list[int], perm: list[int], last: tuple[int, ...], tag: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Reshape(first) -> Transpose(perm) -> Reshape(last), from `source` to `target`."""
    shapes = [
        numpy_helper.from_array(np.array(first, np.int64), f"{tag}_split_shape"),
        numpy_helper.from_array(np.array(last, np.int64), f"{tag}_merge_shape"),
    ]
    nodes = [
        helper.make_node("Reshape", [source, f"{tag}_split_shape"], [f"{tag}_split"], name=f"{tag}_split"),
        helper.make_node("Transpose", [f"{tag}_split"], [f"{tag}_moved"], perm=perm, name=f"{tag}_transpose"),
        helper.make_node("Reshape", [f"{tag}_moved", f"{tag}_merge_shape"], [target], name=f"{tag}_merge"),
    ]
    return nodes, shapes


def _rename(graph: onnx.GraphProto, name: str, new: str, produced: bool) -> None:
    """Nodes read tensor `name` as `new` (and, with `produced`, write it as `new`)."""
    for node in graph.node:
        fields = (node.input, node.output) if produced else (node.input,)
        for names in fields:
            for index, used in enumerate(names):
                if used == name:
                    names[index] = new


def edit_model(
    model: onnx.ModelProto, inputs_transform: dict[str, str], outputs_transform: dict[str, str]
) -> tuple[onnx.ModelProto, dict[str, Transform]]:
    """The edited model and the transform applied to each named input."""
    graph = model.graph
    by_input = {i.name: i for i in graph.input}
    by_output = {o.name: o for o in graph.output}
    front: list[onnx.NodeProto] = []
    back: list[onnx.NodeProto] = []
    applied: dict[str, Transform] = {}
    for name, equation in inputs_transform.items():
        if name not in by_input:
            raise EditError(f"input {name!r} is not an input of the model; its inputs are {sorted(by_input)}")
        transform = parse(equation, _static_shape(by_input[name]))
        inner = f"{name}__orig"
        _rename(graph, name, inner, produced=False)
        for output in graph.output:
            if output.name == name:
                raise EditError(f"input {name!r} is also a graph output; it cannot be transformed")
        nodes, shapes = _chain(
            name, inner, transform.factors_right, transform.to_original, transform.original, f"{name}__in"
        )
        front.extend(nodes)
        graph.initializer.extend(shapes)
        _set_shape(by_input[name], transform.new_shape)
        applied[name] = transform
    for name, equation in outputs_transform.items():
        if name not in by_output:
            raise EditError(
                f"output {name!r} is not an output of the model; its outputs are {sorted(by_output)}"
            )
        transform = parse(equation, _static_shape(by_output[name]))
        inner = f"{name}__orig"
        _rename(graph, name, inner, produced=True)
        nodes, shapes = _chain(
            inner, name, transform.factors_left, transform.to_new, transform.new_shape, f"{name}__out"
        )
        back.extend(nodes)
        graph.initializer.extend(shapes)
        _set_shape(by_output[name], transform.new_shape)
    nodes = [*front, *graph.node, *back]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    onnx.checker.check_model(model)
    return model, applied


def _edit_dataset(dataset: Path, export_path: Path, order: list[str], applied: dict[str, Transform]) -> Path:
    """A copy of dataset.txt beside export_path, with each transformed input's .npy transformed too
    (kept under its own name, as the toolkit keeps it, unless another row's file took that name) and,
    as the toolkit does, each other input's .npy copied unchanged beside them, so the listing names
    files under dataset_for_<stem>/ only and stays valid when the folder is moved."""
    lines = [line.split() for line in dataset.read_text().splitlines() if line.strip()]
    stem = f"dataset_for_{export_path.stem}"
    folder = export_path.parent / stem
    folder.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    written = []
    for row, paths in enumerate(lines):
        if len(paths) != len(order):
            raise EditError(f"{dataset} line {row + 1} lists {len(paths)} file(s) for {len(order)} input(s)")
        out = []
        for column, (text, name) in enumerate(zip(paths, order, strict=True)):
            source = dataset.parent / text
            is_npy = source.suffix.lower() == ".npy"
            if name not in applied and not is_npy:  # an image: listed where it is
                out.append(str(source.resolve()))
                continue
            if not is_npy:
                raise EditError(f"{source}: only .npy data can be transformed for input {name!r}")
            file_name = source.name if source.name not in taken else f"{row}_{column}_{source.name}"
            taken.add(file_name)
            if name in applied:
                np.save(folder / file_name, applied[name].apply(np.load(source, allow_pickle=False)))
            else:
                shutil.copyfile(source, folder / file_name)
            out.append(f"{stem}/{file_name}")
        written.append(" ".join(out))
    listing = export_path.parent / f"{stem}.txt"
    listing.write_text("\n".join(written) + "\n")
    return listing


def onnx_edit(
    model: str,
    export_path: str,
    inputs_transform: dict[str, str] | None = None,
    outputs_transform: dict[str, str] | None = None,
    dataset: str | None = None,
) -> int:
    """Write the edited model to export_path; 0, or -1 with the reason logged."""
    log = ToolkitLog()
    try:
        loaded = onnx.load(model)
        edited, applied = edit_model(loaded, dict(inputs_transform or {}), dict(outputs_transform or {}))
        onnx.save(edited, export_path)
        for name, transform in applied.items():
            log.i(
                "onnx_edit",
                f"input {name!r} reset to shape {list(transform.new_shape)} (was {list(transform.original)})",
            )
        if dataset is not None:
            order = [
                i.name for i in edited.graph.input if i.name not in {t.name for t in edited.graph.initializer}
            ]
            listing = _edit_dataset(Path(dataset), Path(export_path), order, applied)
            log.say("onnx_edit", f"New dataset has been saved to {str(listing)!r}.")
    except Exception as exc:  # a toolkit function answers -1, never raises (protobuf's DecodeError too)
        log.e("onnx_edit", str(exc))
        return -1
    return 0
