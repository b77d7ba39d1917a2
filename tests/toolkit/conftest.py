"""The real RKNN-Toolkit2 for the bridge tests: found as `rknn-client toolkit status` finds it (`make
toolkit` installs it once into ~/.cache/rknn_client). Without one these tests skip and say why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rknn_client.toolkit import Missing, Toolkit, ToolkitBridge, locate
from tests import models

SIZE = 32


@pytest.fixture(scope="session")
def toolkit() -> Toolkit:
    found = locate()
    if isinstance(found, Missing):
        pytest.skip(f"no RKNN-Toolkit2 to test the bridge with ({found.reason}); `make toolkit` installs one")
    return found


@pytest.fixture(scope="session")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[np.ndarray]]:
    """A small ONNX classifier, a calibration dataset.txt of NCHW .npy files, and those inputs."""
    folder = tmp_path_factory.mktemp("toolkit-model")
    model = models.small_cnn(folder / "cnn.onnx", size=SIZE)
    rng = np.random.default_rng(7)
    samples = [(rng.random((1, 3, SIZE, SIZE)) * 255).astype(np.float32) for _ in range(4)]
    names = []
    for i, sample in enumerate(samples):
        np.save(folder / f"cal{i}.npy", sample)
        names.append(str(folder / f"cal{i}.npy"))
    dataset = folder / "dataset.txt"
    dataset.write_text("\n".join(names) + "\n")
    return model, dataset, samples


def start(toolkit: Toolkit) -> ToolkitBridge:
    bridge = ToolkitBridge.start(toolkit)
    assert isinstance(bridge, ToolkitBridge), bridge
    return bridge


@pytest.fixture(scope="module")
def built(toolkit: Toolkit, classifier: tuple[Path, Path, list[np.ndarray]]) -> Iterator[ToolkitBridge]:
    """A worker that has run config + load_onnx + build(do_quantization=True) on the classifier."""
    model, dataset, _ = classifier
    bridge = start(toolkit)
    try:
        steps = [
            bridge.call(
                "config", mean_values=[[0, 0, 0]], std_values=[[255, 255, 255]], target_platform="rk3588"
            ),
            bridge.call("load_onnx", str(model)),
            bridge.call("build", do_quantization=True, dataset=str(dataset)),
        ]
        assert [(s.ok, s.value) for s in steps] == [(True, 0)] * 3, [s.error for s in steps]
        yield bridge
    finally:
        bridge.close()
