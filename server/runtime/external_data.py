"""Every external-data reference of an ONNX model, checked before anything loads the model.

An ONNX tensor can keep its bytes in another file (`data_location = EXTERNAL`, `location=...`).
ONNX Runtime resolves that file against the model's folder when it loads a path, but against the
process's working directory when it loads bytes (the rewritten QDQ and layer-dump models), and its
errors tell whether a file exists and how long it is. An uploaded model is hostile: here every tensor
of the whole graph (initializers, sparse tensors, node attributes such as Constant's `value`, the
graphs of If/Loop/Scan, functions, training graphs) may name only a plain file of the model's own
upload, so no model can make the daemon read, stat or report on anything else.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import onnx

from rknn_server.runtime.base import ModelFormatError

# Offsets and lengths ONNX Runtime accepts as integers of this many digits at most (int64).
_MAX_DIGITS = 19


def _sparse(where: str, sparse: onnx.SparseTensorProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    yield f"values of sparse {where}", sparse.values
    yield f"indices of sparse {where}", sparse.indices


def _node(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Tensors held by a node's attributes, and those of the graphs it holds (If/Loop/Scan bodies)."""
    label = node.name or node.op_type
    for attr in node.attribute:
        where = f"of node {label!r} (attribute {attr.name!r})"
        if attr.HasField("t"):
            yield f"tensor {attr.t.name or attr.name!r} {where}", attr.t
        for t in attr.tensors:
            yield f"tensor {t.name or attr.name!r} {where}", t
        if attr.HasField("sparse_tensor"):
            yield from _sparse(f"tensor {where}", attr.sparse_tensor)
        for s in attr.sparse_tensors:
            yield from _sparse(f"tensor {where}", s)
        for body in [attr.g] if attr.HasField("g") else []:
            yield from _graph(body)
        for body in attr.graphs:
            yield from _graph(body)


def _graph(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for t in graph.initializer:
        yield f"initializer {t.name!r}", t
    for s in graph.sparse_initializer:
        yield from _sparse(f"initializer {s.values.name!r}", s)
    for node in graph.node:
        yield from _node(node)


def all_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(description for a message, tensor) for every tensor the model holds, wherever it sits."""
    yield from _graph(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node(node)
    for training in model.training_info:
        yield from _graph(training.initialization)
        yield from _graph(training.algorithm)


def uses_external_data(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data) > 0


def _file_name(location: str) -> str | None:
    """The one file name a location names, or None when it is anything but a plain name in the folder."""
    if not location or "\0" in location or "\\" in location:
        return None
    path = PurePosixPath(location)
    if path.is_absolute() or len(path.parts) != 1 or path.parts[0] in (".", ".."):
        return None
    name = path.parts[0]
    return None if name.startswith(".") else name  # dot files are the cache's own (".main")


def _integer(entries: dict[str, str], key: str, where: str) -> int:
    text = entries.get(key, "0")
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS):
        raise ModelFormatError(
            f"{where} has external-data {key} {text[:40]!r}; expected a non-negative integer"
        )
    return int(text)


def _check(where: str, tensor: onnx.TensorProto, folder: Path) -> None:
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location")
    if location is None:
        raise ModelFormatError(f"{where} is external data without a location")
    shown = repr(location[:200])
    name = _file_name(location)
    if name is None:
        raise ModelFormatError(
            f"{where} names external data {shown}, which is not a plain file name: external data must be "
            "a file uploaded beside the model (no folders, no '..', no absolute paths)"
        )
    try:
        info = os.lstat(folder / name)
    except (OSError, ValueError):
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        raise ModelFormatError(
            f"{where} names external data {shown}, which is not a file of this model's upload "
            "(upload it with the model, in the model's folder)"
        )
    offset, length = _integer(entries, "offset", where), _integer(entries, "length", where)
    if offset + length > info.st_size:
        raise ModelFormatError(
            f"{where} reads bytes {offset}..{offset + length} of {name!r}, past the end of that file"
        )


def check_external_data(model: onnx.ModelProto, folder: Path) -> None:
    """Raise ModelFormatError unless every external-data reference of `model` names a regular file
    (not a link) directly inside `folder` and stays within it. Reads no tensor data."""
    for where, tensor in all_tensors(model):
        if uses_external_data(tensor):
            _check(where, tensor, folder)
