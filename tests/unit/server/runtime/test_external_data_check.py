"""The external-data check finds a reference wherever a model can hold a tensor, before any load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from rknn_server.runtime.base import ModelFormatError
from rknn_server.runtime.external_data import check_external_data
from tests.reliability.hostile_models import external_tensor

BAD = "../../etc/shadow"


def _body(tensor: TensorProto) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Constant", [], ["v"], value=tensor, name="inner")],
        "body",
        [],
        [helper.make_tensor_value_info("v", TensorProto.UINT8, [8])],
    )


def _model(*nodes: onnx.NodeProto, functions: tuple[onnx.FunctionProto, ...] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", [], [])
    return helper.make_model(graph, functions=list(functions))


HOLDERS: dict[str, Callable[[TensorProto], onnx.ModelProto]] = {
    "ConstantOfShape value": lambda t: _model(helper.make_node("ConstantOfShape", ["s"], ["o"], value=t)),
    "Loop body": lambda t: _model(helper.make_node("Loop", ["n", "c"], ["o"], body=_body(t))),
    "Scan body": lambda t: _model(helper.make_node("Scan", ["x"], ["o"], body=_body(t), num_scan_inputs=1)),
    "nested If in Loop": lambda t: _model(
        helper.make_node(
            "Loop",
            ["n", "c"],
            ["o"],
            body=helper.make_graph(
                [helper.make_node("If", ["c"], ["v"], then_branch=_body(t), else_branch=_body(t))],
                "b",
                [],
                [],
            ),
        )
    ),
    "sparse attribute": lambda t: _model(
        helper.make_node(
            "Constant",
            [],
            ["o"],
            sparse_value=helper.make_sparse_tensor(
                t, helper.make_tensor("i", TensorProto.INT64, [1], [0]), [8]
            ),
        )
    ),
    "tensors attribute": lambda t: _model(helper.make_node("Custom", [], ["o"], domain="x", weights=[t])),
    "function body": lambda t: _model(
        functions=(
            helper.make_function("x", "F", [], ["v"], [helper.make_node("Constant", [], ["v"], value=t)], []),
        )
    ),
}


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_references_anywhere_in_the_model_are_checked(holder: str, tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="not a plain file name"):
        check_external_data(HOLDERS[holder](external_tensor("w", BAD)), tmp_path)


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("w.bin", ""),
        ("./w.bin", ""),
        ("missing.bin", "not a file of this model's upload"),
        ("sub", "not a file of this model's upload"),
        (".main", "not a plain file name"),
        ("sub/w.bin", "not a plain file name"),
        ("/etc/passwd", "not a plain file name"),
        ("..", "not a plain file name"),
        ("*/_ORT_MEM_ADDR_/*", "not a plain file name"),
    ],
)
def test_only_plain_files_of_the_folder_pass(location: str, reason: str, tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(bytes(8))
    (tmp_path / ".main").write_text("m.onnx")
    (tmp_path / "sub").mkdir()
    model = HOLDERS["Loop body"](external_tensor("w", location))
    if not reason:
        check_external_data(model, tmp_path)
        return
    with pytest.raises(ModelFormatError, match=reason):
        check_external_data(model, tmp_path)


def test_a_read_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(bytes(8))
    with pytest.raises(ModelFormatError, match="past the end"):
        check_external_data(HOLDERS["Loop body"](external_tensor("w", "w.bin", length=9)), tmp_path)
