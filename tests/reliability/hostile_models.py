"""Models that try to read files through ONNX external data, and a raw uploader that sends them as a
hostile client would (no client-side checks of what the model names).

Every model is QDQ: an 8-byte uint8 tensor `c` (from external data) is added to the input and the sum
leaves through DequantizeLinear (scale 1, zero 0), so the host runtime rewrites it and loads it from
bytes, and a run with zeros returns c's bytes as the output.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import grpc
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import FileEntry, manifest_digest
from tests.models import onnx_model

SIZE = 8
PLACES = ("constant", "if_branch", "sparse_initializer", "initializer")


def external_tensor(name: str, location: str, length: int = SIZE) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.UINT8, dims=[length])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _branch(name: str, location: str) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Constant", [], [f"{name}_c"], value=external_tensor("w", location), name=name)],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_c", TensorProto.UINT8, [SIZE])],
    )


def reader_model(location: str, place: str) -> bytes:
    """A QDQ model whose tensor `c` is external data at `location`, held where `place` says."""
    nodes: list[onnx.NodeProto] = []
    initializers = [
        numpy_helper.from_array(np.array(1.0, np.float32), "scale"),
        numpy_helper.from_array(np.array(0, np.uint8), "zero"),
    ]
    sparse: list[onnx.SparseTensorProto] = []
    if place == "initializer":
        initializers.append(external_tensor("c", location))
    elif place == "constant":
        nodes.append(
            helper.make_node("Constant", [], ["c"], value=external_tensor("w", location), name="Const_3")
        )
    elif place == "if_branch":
        initializers.append(numpy_helper.from_array(np.array(True), "cond"))
        nodes.append(
            helper.make_node(
                "If",
                ["cond"],
                ["c"],
                then_branch=_branch("then_const", location),
                else_branch=_branch("else_const", location),
                name="If_1",
            )
        )
    elif place == "sparse_initializer":
        indices = numpy_helper.from_array(np.arange(SIZE, dtype=np.int64), "c_indices")
        sparse.append(helper.make_sparse_tensor(external_tensor("c", location), indices, [SIZE]))
    else:
        raise ValueError(place)
    nodes += [
        helper.make_node("Add", ["x", "c"], ["sum"], name="add"),
        helper.make_node("DequantizeLinear", ["sum", "scale", "zero"], ["y"], name="dq"),
    ]
    graph = helper.make_graph(
        nodes,
        "reader",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SIZE])],
        initializers,
        sparse_initializer=sparse,
    )
    model = onnx_model(graph)
    return model.SerializeToString()


def upload_raw(channel: grpc.Channel, files: Sequence[tuple[str, bytes]]) -> str:
    """Upload files as they are (the first is the main file); returns the model's digest."""
    entries = [FileEntry(name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files]
    manifest = rknn_pb2.ModelManifest(
        digest=manifest_digest(entries),
        files=[rknn_pb2.ModelFile(name=e.name, size=e.size, sha256=e.sha256) for e in entries],
    )
    requests = [
        rknn_pb2.UploadModelRequest(
            header=rknn_pb2.UploadHeader(manifest=manifest, start_offsets=[0] * len(files))
        )
    ] + [
        rknn_pb2.UploadModelRequest(chunk=rknn_pb2.UploadChunk(file_index=i, offset=0, data=data))
        for i, (_, data) in enumerate(files)
    ]
    stub = rknn_pb2_grpc.RknnServerStub(channel)
    if not stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=manifest), timeout=30).cached:
        stub.UploadModel(iter(requests), timeout=60)
    return manifest.digest
