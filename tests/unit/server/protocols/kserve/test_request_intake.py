"""A v2 request's intake, in-process on ONNX Runtime: a model keeps its last request's checks for the
next request sending the same inputs as raw bytes (CheckedRequest), and every other request is
checked afresh, refused as ever; each request's own bytes are what runs."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rknn_proto import codec
from rknn_server.errors import InvalidInput
from rknn_server.protocols.kserve import models as v2
from rknn_server.protocols.kserve.models import InputTensor, V2Models
from rknn_server.runtime.host import HostBackend
from tests.models import two_inputs
from tests.unit.server.protocols.kserve.serving import models_of

CALLER = "uid:1000"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[V2Models]:
    """The repository model `m` (y = a * 2 + b, and a's shape) served by the host runtime."""
    with ThreadPoolExecutor(2) as executor:
        models = models_of(tmp_path, executor, HostBackend(threads=1), make=two_inputs)
        asyncio.run(models.load_all())
        try:
            yield models
        finally:
            models.plane.close_all("test over")
            models.plane.shutdown()


def raw(name: str, array: np.ndarray, datatype: str = "FP32") -> InputTensor:
    return InputTensor(name, datatype, tuple(array.shape), raw=array.tobytes())


def infer(models: V2Models, *inputs: InputTensor) -> np.ndarray:
    _, outputs = asyncio.run(models.infer("m", "", CALLER, inputs, ["y"]))
    return outputs[0].array


def test_a_request_like_the_last_one_is_checked_once_and_runs_its_own_bytes(
    served: V2Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = []
    real = v2.plan_inputs
    monkeypatch.setattr(v2, "plan_inputs", lambda *args: checks.append(1) or real(*args))
    rng = np.random.default_rng(0)
    for _ in range(3):
        a, b = rng.standard_normal((2, 1, 4)).astype(np.float32)
        # b first: the request's order is not the model's
        np.testing.assert_array_equal(infer(served, raw("b", b), raw("a", a)), a * 2 + b)
    assert len(checks) == 1
    a, b = rng.standard_normal((2, 1, 4)).astype(np.float32)
    np.testing.assert_array_equal(infer(served, raw("a", a), raw("b", b)), a * 2 + b)  # another order
    assert len(checks) == 2


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ((raw("a", np.zeros((1, 5), np.float32)), raw("b", np.zeros((1, 4), np.float32))), r"shape \[1, 5\]"),
        ((raw("a", np.zeros((1, 4), np.float64), "FP64"), raw("b", np.zeros((1, 4), np.float32))), "float32"),
        (
            (InputTensor("a", "FP32", (1, 4), raw=b"\0" * 12), raw("b", np.zeros((1, 4), np.float32))),
            "12 bytes of raw contents",
        ),
        ((raw("a", np.zeros((1, 4), np.float32)), raw("a", np.zeros((1, 4), np.float32))), "sent twice"),
        ((raw("a", np.zeros((1, 4), np.float32)), raw("c", np.zeros((1, 4), np.float32))), "no input 'c'"),
        ((raw("a", np.zeros((1, 4), np.float32)),), r"input\(s\) b missing"),
    ],
)
def test_a_request_unlike_the_last_one_is_checked_and_refused_as_ever(
    served: V2Models, inputs: tuple[InputTensor, ...], says: str
) -> None:
    ones = np.ones((1, 4), np.float32)
    infer(served, raw("a", ones), raw("b", ones))  # the model now keeps this request's intake
    with pytest.raises(InvalidInput, match=says):
        infer(served, *inputs)
    np.testing.assert_array_equal(infer(served, raw("a", ones), raw("b", ones)), ones * 3)


def test_other_limits_and_typed_contents_are_checked_every_time(
    served: V2Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    ones = np.ones((1, 4), np.float32)
    infer(served, raw("a", ones), raw("b", ones))
    served.plane.tensor_limits = dataclasses.replace(served.plane.tensor_limits, max_tensor_bytes=8)
    with pytest.raises(codec.LimitExceeded, match="max_tensor_bytes=8"):
        infer(served, raw("a", ones), raw("b", ones))
    served.plane.tensor_limits = codec.TensorLimits()
    typed = [InputTensor(n, "FP32", (1, 4), values=[1.0, 1.0, 1.0, 1.0]) for n in "ab"]
    infer(served, *typed)
    checks = []
    real = v2.plan_inputs
    monkeypatch.setattr(v2, "plan_inputs", lambda *args: checks.append(1) or real(*args))
    np.testing.assert_array_equal(infer(served, *typed), ones * 3)
    assert checks == [1]
    with pytest.raises(InvalidInput, match="elements for shape"):
        infer(served, InputTensor("a", "FP32", (1, 4), values=[1.0]), typed[1])
