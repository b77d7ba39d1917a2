"""A model's declared dims and shape ranges, and switching its input shapes, through the runtime
interface: the rknnrt runtime on the stand-in librknnrt, alone and in an isolated worker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rknn_server.runtime.base import Backend, InputError, InputShapes, RuntimeOptions
from rknn_server.runtime.isolated import IsolatedBackend
from rknn_server.runtime.rknnrt.backend import RknnrtBackend
from tests.rknnrt.stub_build import StubTensor, write_stub_model
from tests.rknnrt.test_backend import RK3588

SMALL, BIG = (1, 2, 2, 3), (1, 4, 4, 3)


@pytest.fixture(params=["alone", "isolated"])
def backend(request: pytest.FixtureRequest, stub_lib: Path) -> Backend:
    inner = RknnrtBackend(stub_lib, RK3588, None)
    return inner if request.param == "alone" else IsolatedBackend(inner, call_timeout_s=60)


def test_a_dynamic_model_declares_its_dims_and_shapes_and_switches_between_them(
    backend: Backend, tmp_path: Path
) -> None:
    path = write_stub_model(
        tmp_path / "d.rknn",
        inputs=[StubTensor("x", "FP32", "NHWC", SMALL)],
        outputs=[StubTensor("y", "FP32", "NHWC", SMALL)],
        dynamic=[SMALL, BIG],
    )
    model = backend.open(path, RuntimeOptions())
    try:
        # The stand-in's input attribute gives its last shape; a TensorAttr marks the free dims -1.
        assert model.input_shapes() == [InputShapes(BIG, (SMALL, BIG))]
        assert model.inputs[0].shape == (1, -1, -1, 3)
        inputs, outputs = model.set_input_shapes([SMALL])
        assert [(a.name, a.shape, a.size_bytes) for a in inputs] == [("x", SMALL, 48)]
        assert [(a.name, a.shape, a.size_bytes) for a in outputs] == [("y", SMALL, 48)]
        x = np.arange(12, dtype=np.float32).reshape(SMALL)
        np.testing.assert_array_equal(model.run([x])[0], 2 * x + 1)
        with pytest.raises(InputError, match="not among the model's shapes"):
            model.set_input_shapes([(1, 3, 3, 3)])
        assert model.set_input_shapes([BIG])[1][0].shape == BIG
    finally:
        model.close()


def test_a_static_model_has_no_ranges_and_refuses_other_shapes(backend: Backend, tmp_path: Path) -> None:
    model = backend.open(write_stub_model(tmp_path / "s.rknn"), RuntimeOptions())
    try:
        assert model.input_shapes() == [InputShapes(SMALL)]
        with pytest.raises(InputError, match="static input shapes"):
            model.set_input_shapes([BIG])
    finally:
        model.close()
