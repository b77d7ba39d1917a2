"""Every toolkit method and module a script imports exists: it works, or answers -1 saying what to install."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from rknn_client import RKNN
from rknn_client.compat.custom_op import get_node_attr
from rknn_client.compat.onnx_edit import onnx_edit
from tests.models import save_graph

CALLS: dict[str, Callable[[RKNN], int]] = {
    "hybrid_quantization_step1": lambda r: r.hybrid_quantization_step1(dataset="dataset.txt", proposal=False),
    "hybrid_quantization_step2": lambda r: r.hybrid_quantization_step2("m.model", "m.data", "m.cfg"),
    "export_encrypted_rknn_model": lambda r: r.export_encrypted_rknn_model("m.rknn", crypt_level=1),
    "reg_custom_op": lambda r: r.reg_custom_op(type("cstSoftmax", (), {"op_type": "cstSoftmax"})),
    "codegen": lambda r: r.codegen(output_path="./rknn_app_demo", inputs=["a.jpg"], overwrite=True),
    "optimize_onnx": lambda r: r.optimize_onnx("m.onnx"),
}


@pytest.mark.parametrize("method", sorted(CALLS))
def test_toolkit_only_methods_answer_minus_one_naming_what_to_install(
    method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rknn = RKNN()
    assert CALLS[method](rknn) == -1
    rknn.release()
    err = capsys.readouterr().err
    assert err.startswith(f"E {method}: ") and "rknn-client toolkit install" in err


def test_get_node_attr_reads_the_nodes_attributes() -> None:
    node = helper.make_node("cstSoftmax", ["x"], ["y"], axis=-1, mode="fast", scales=[1.0, 2.0])
    assert get_node_attr(node, "axis") == -1
    assert get_node_attr(node, "mode") == "fast"
    assert get_node_attr(node, "scales") == [1.0, 2.0]
    assert get_node_attr(node, "missing") is None


def kv_model(path: Path) -> Path:
    """k_cache.1 [4, 48, 1, 8] -> Transpose(0, 3, 1, 2) * 2 -> k_cache [4, 8, 48, 1]: the example's shapes."""
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["k_cache.1"], ["t"], perm=[0, 3, 1, 2]),
            helper.make_node("Add", ["t", "t"], ["k_cache"]),
        ],
        "kv",
        [helper.make_tensor_value_info("k_cache.1", TensorProto.FLOAT, [4, 48, 1, 8])],
        [helper.make_tensor_value_info("k_cache", TensorProto.FLOAT, [4, 8, 48, 1])],
    )
    return save_graph(graph, path)


def test_onnx_edit_reshapes_and_transposes_inputs_outputs_and_dataset(tmp_path: Path) -> None:
    model = kv_model(tmp_path / "kv.onnx")
    x = np.random.default_rng(0).standard_normal((4, 48, 1, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "dataset.txt").write_text("x.npy\n")
    edited = tmp_path / "out" / "kv_edited.onnx"
    edited.parent.mkdir()
    ret = onnx_edit(
        model=str(model),
        export_path=str(edited),
        inputs_transform={"k_cache.1": "a,b,c,d->1,ad,b,c"},
        outputs_transform={"k_cache": "a,b,c,d->1,ab,c,d"},
        dataset=str(tmp_path / "dataset.txt"),
    )
    assert ret == 0
    # a,b,c,d -> 1,ad,b,c: move d after a, merge them, add a leading 1.
    x_new = x.transpose(0, 3, 1, 2).reshape(1, 32, 48, 1)
    original = ort.InferenceSession(str(model)).run(None, {"k_cache.1": x})[0]
    session = ort.InferenceSession(str(edited))
    assert session.get_inputs()[0].shape == [1, 32, 48, 1]
    got = session.run(None, {"k_cache.1": x_new})[0]
    np.testing.assert_array_equal(got, original.reshape(1, 32, 48, 1))
    listing = (edited.parent / "dataset_for_kv_edited.txt").read_text().split()  # the toolkit's names
    assert listing == ["dataset_for_kv_edited/x.npy"]
    np.testing.assert_array_equal(np.load(edited.parent / listing[0]), x_new)


def two_input_kv_model(path: Path) -> Path:
    """The official concat_block's inputs: feature_0 [4, 48, 1, 8] untouched beside k_cache.1."""
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["k_cache.1"], ["t"], perm=[0, 3, 1, 2]),
            helper.make_node("Add", ["t", "feature_0"], ["k_cache"]),
        ],
        "kv2",
        [
            helper.make_tensor_value_info("feature_0", TensorProto.FLOAT, [4, 8, 48, 1]),
            helper.make_tensor_value_info("k_cache.1", TensorProto.FLOAT, [4, 48, 1, 8]),
        ],
        [helper.make_tensor_value_info("k_cache", TensorProto.FLOAT, [4, 8, 48, 1])],
    )
    return save_graph(graph, path)


def test_onnx_edit_dataset_copies_untransformed_inputs_beside_the_transformed(tmp_path: Path) -> None:
    """As RKNN-Toolkit2 2.5.0 writes it for examples/functions/onnx_edit: the input left alone is copied
    unchanged into dataset_for_<stem>/ too, so the listing holds no path outside that folder and still
    works after the folder is moved."""
    source = tmp_path / "src"
    source.mkdir()
    model = two_input_kv_model(source / "kv.onnx")
    rng = np.random.default_rng(0)
    feature = rng.standard_normal((4, 8, 48, 1)).astype(np.float32)
    k = rng.standard_normal((4, 48, 1, 8)).astype(np.float32)
    np.save(source / "feature.npy", feature)
    np.save(source / "k.npy", k)
    (source / "dataset.txt").write_text("feature.npy k.npy\n")
    ret = onnx_edit(
        model=str(model),
        export_path=str(source / "kv_edited.onnx"),
        inputs_transform={"k_cache.1": "a,b,c,d->1,ad,b,c"},
        dataset=str(source / "dataset.txt"),
    )
    assert ret == 0
    moved = tmp_path / "moved"
    source.rename(moved)
    listing = (moved / "dataset_for_kv_edited.txt").read_text().split()
    assert listing == ["dataset_for_kv_edited/feature.npy", "dataset_for_kv_edited/k.npy"]
    np.testing.assert_array_equal(np.load(moved / listing[0]), feature)
    np.testing.assert_array_equal(np.load(moved / listing[1]), k.transpose(0, 3, 1, 2).reshape(1, 32, 48, 1))


def test_onnx_edit_splits_a_dimension_by_assignment(tmp_path: Path) -> None:
    model = kv_model(tmp_path / "kv.onnx")
    edited = tmp_path / "kv_split.onnx"
    assert onnx_edit(str(model), str(edited), inputs_transform={"k_cache.1": "a,bc,1,d[b=6]->b,1,acd"}) == 0
    x = np.arange(4 * 48 * 8, dtype=np.float32).reshape(4, 48, 1, 8)
    x_new = x.reshape(4, 6, 8, 1, 8).transpose(1, 3, 0, 2, 4).reshape(6, 1, 256)
    got = ort.InferenceSession(str(edited)).run(None, {"k_cache.1": x_new})[0]
    np.testing.assert_array_equal(got, ort.InferenceSession(str(model)).run(None, {"k_cache.1": x})[0])


@pytest.mark.parametrize(
    ("equation", "says"),
    [
        ("a,b,c->a,b,c", "names 3 dimension(s), the tensor has 4"),
        ("a,b,c,d->a,b,c", "each left letter exactly once"),
        ("a,bc,1,d->a,b,c,d", "several unknown factors"),
        ("a,b,c,d[b=5]->a,b,c,d", "multiplies to 5, the dimension is 48"),
    ],
)
def test_onnx_edit_refuses_bad_equations_with_minus_one(
    tmp_path: Path, equation: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = kv_model(tmp_path / "kv.onnx")
    assert onnx_edit(str(model), str(tmp_path / "e.onnx"), inputs_transform={"k_cache.1": equation}) == -1
    assert says in capsys.readouterr().err
    assert not (tmp_path / "e.onnx").exists()
    assert onnx.load(str(model)).graph.input[0].name == "k_cache.1"
