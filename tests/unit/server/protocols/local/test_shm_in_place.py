"""Outputs written by the runtime straight into a mapped region (ModelRuntime.run_into), in-process.

The host runtime runs a real ONNX model through ONNX Runtime's IOBinding; the slots are views of a
real sealed memfd registered with the registry, as the daemon maps it."""

from __future__ import annotations

import dataclasses
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rknn_proto.messages import QuantType
from rknn_server.core.shm import Region, SharedMemoryRegistry, ShmLimits
from rknn_server.errors import ResourceExhausted
from rknn_server.protocols.local.shm_run import Slot, _in_place
from rknn_server.runtime.base import ModelRuntime, RuntimeOptions
from rknn_server.runtime.host import HostBackend
from tests.models import save_graph, small_cnn
from tests.unit.server.fakes import OUTPUT, FakeRuntime

UID = os.getuid()
SIZE = 65536


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SharedMemoryRegistry]:
    registry = SharedMemoryRegistry(ShmLimits(), idle_timeout_s=60.0, directory=tmp_path)
    yield registry
    registry.close_all()


def _memfd_region(registry: SharedMemoryRegistry, key: str) -> Region:
    fd = os.memfd_create("rknn-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, SIZE)
        os.pwrite(fd, b"\xab" * SIZE, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return registry.register("uid:0", UID, key, "", 0, "", memfd=(os.getpid(), fd))
    finally:
        os.close(fd)


def test_the_host_runtime_writes_its_outputs_into_the_given_arrays_bit_for_bit(tmp_path: Path) -> None:
    model = HostBackend(threads=1).open(small_cnn(tmp_path / "cnn.onnx"), RuntimeOptions())
    shared = mmap.mmap(-1, SIZE)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    placed = np.ndarray(x.shape, x.dtype, shared, 0)  # the input read where it lies
    placed[...] = x
    want = model.run([x])
    target = np.ndarray(want[0].shape, want[0].dtype, shared, 4096)
    got = model.run_into([placed], [target])
    assert got[0] is target
    assert target.tobytes() == want[0].tobytes()
    assert placed.tobytes() == x.tobytes()  # inputs are only read
    model.close()


def test_a_runtime_that_cannot_write_in_place_returns_its_own_arrays(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "m", RuntimeOptions())
    x = np.ones((1, 3, 4, 4), np.float32)
    target = np.zeros((1, 3, 4, 4), np.float32)
    got = runtime.run_into([x], [target])
    assert got[0] is not target and np.array_equal(got[0], x * 2)
    assert not target.any()  # left for the caller to copy into


def test_in_place_only_into_mapped_aligned_slots_that_hold_the_outputs(
    registry: SharedMemoryRegistry, tmp_path: Path
) -> None:
    mapped = _memfd_region(registry, "m")
    (tmp_path / "f").write_bytes(b"\xab" * SIZE)
    file = registry.register("uid:0", UID, "f", "f", 0, "")
    nbytes = 1 * 3 * 4 * 4 * 4
    targets = _in_place([Slot(mapped, 64, nbytes)], [OUTPUT], native=False)
    assert targets is not None
    assert targets[0].shape == OUTPUT.shape and targets[0].dtype == OUTPUT.dtype
    targets[0][...] = 1.5
    assert np.array_equal(
        np.frombuffer(os.pread(mapped.fd, nbytes, 64), np.float32), np.full(48, 1.5, np.float32)
    )
    assert _in_place([Slot(file, 64, nbytes)], [OUTPUT], native=False) is None  # never mapped
    assert _in_place([Slot(mapped, 66, nbytes)], [OUTPUT], native=False) is None  # misaligned for float32
    quantized = dataclasses.replace(
        OUTPUT, dtype=np.dtype(np.int8), quant_type=QuantType.AFFINE_ASYMMETRIC, zero_point=0, scale=0.1
    )
    assert _in_place([Slot(mapped, 1024, 48)], [quantized], native=False) is None  # dequantized first
    assert _in_place([Slot(mapped, 1024, 48)], [quantized], native=True) is not None
    dynamic = dataclasses.replace(OUTPUT, shape=(1, -1))
    assert _in_place([Slot(mapped, 1024, nbytes)], [dynamic], native=False) is None
    before = os.pread(mapped.fd, SIZE, 0)
    with pytest.raises(ResourceExhausted, match=f"holds {nbytes - 1}"):
        _in_place([Slot(mapped, 4096, nbytes - 1)], [OUTPUT], native=False)
    assert os.pread(mapped.fd, SIZE, 0) == before  # refused before anything was written


def _misdeclared(tmp_path: Path) -> ModelRuntime:
    """A model that declares y as 1x4 but computes 1x8: ONNX Runtime runs it, but cannot place it."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "misdeclared",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    return HostBackend(threads=1).open(save_graph(graph, tmp_path / "m.onnx"), RuntimeOptions())


def test_an_output_unlike_its_declaration_falls_back_to_the_runtimes_own_array(tmp_path: Path) -> None:
    model = _misdeclared(tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    target = np.full((1, 4), -1, np.float32)
    got = model.run_into([x], [target])
    assert got[0] is not target and np.array_equal(got[0], x)  # what `run` gives, for the caller to check
    assert (target == -1).all()  # nothing was written into the given array
    model.close()


def test_a_bound_run_reads_its_inputs_memory_afresh_on_every_call(tmp_path: Path) -> None:
    """A doorbell's frames reuse one binding: each call must see what was written since, not the
    values the binding was made over, and write into the same targets."""
    model = HostBackend(threads=1).open(small_cnn(tmp_path / "cnn.onnx"), RuntimeOptions())
    frames = [np.full((1, 3, 16, 16), v, np.float32) for v in (-1.0, 0.5, 2.0)]
    want = [model.run([f])[0].tobytes() for f in frames]
    assert len(set(want)) == len(want)
    placed = np.zeros_like(frames[0])
    target = np.zeros(model.outputs[0].shape, model.outputs[0].dtype)
    run = model.bind([placed], [target])
    for frame, expected in zip(frames, want, strict=True):
        placed[...] = frame
        got = run()
        assert got[0] is target and target.tobytes() == expected
    model.close()


def test_a_bound_run_of_a_misdeclared_output_still_answers_what_run_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """...and asks ONNX Runtime to place it only once: a refused binding is refused on every frame."""
    model = _misdeclared(tmp_path)
    x = np.zeros((1, 8), np.float32)
    target = np.full((1, 4), -1, np.float32)
    run = model.bind([x], [target])
    session = model._model.session  # type: ignore[attr-defined]
    tries: list[object] = []

    def counted(binding: object, *args: object) -> None:
        tries.append(binding)
        ort.InferenceSession.run_with_iobinding(session, binding, *args)

    monkeypatch.setattr(session, "run_with_iobinding", counted)
    for value in (1.0, 3.0, 5.0):
        x[...] = value
        got = run()
        assert got[0] is not target and np.array_equal(got[0], x)
    assert (target == -1).all()
    assert len(tries) == 1
    model.close()
