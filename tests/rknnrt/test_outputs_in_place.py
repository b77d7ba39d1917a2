"""ModelRuntime.run_into on the rknnrt backend (what a shared-memory frame runs): outputs land in the
caller's arrays, the region's slots, with no buffer of the runtime's and no copy of ours in between
where the runtime's API allows it; anything that does not fit comes back as a new array."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from rknn_server.board.platform import PlatformInfo
from rknn_server.runtime.base import InputFormat, RuntimeOptions
from rknn_server.runtime.rknnrt.backend import RknnrtBackend
from tests.rknnrt.stub_build import StubTensor, write_stub_model

RK3588 = PlatformInfo(soc="rk3588", driver_version="0.9.8")
FLOAT_OUT = StubTensor("out0", type="FP32", fmt="NHWC", dims=(1, 2, 2, 3))
QUANT_OUT = StubTensor("out0", type="INT8", fmt="NCHW", dims=(1, 3, 2, 2), zp=-3, scale=0.5)


def owned_output_bytes(lib: Path) -> int:
    """The stub's count of output bytes written into buffers of its own (the backend's CDLL is the
    same loaded library: one path, one handle)."""
    return int(ctypes.c_ulonglong.in_dll(ctypes.CDLL(str(lib)), "rknn_stub_owned_output_bytes").value)


def test_the_general_api_writes_outputs_into_the_callers_arrays(stub_lib: Path, tmp_path: Path) -> None:
    model = RknnrtBackend(stub_lib, RK3588, None).open(
        write_stub_model(tmp_path / "f.rknn", outputs=[FLOAT_OUT]), RuntimeOptions()
    )
    try:
        x = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
        before = owned_output_bytes(stub_lib)
        (want,) = model.run([x])
        assert owned_output_bytes(stub_lib) - before == want.nbytes  # run(): the runtime's buffer, copied
        slot = np.full(want.shape, np.nan, np.float32)
        before = owned_output_bytes(stub_lib)
        (got,) = model.run_into([x + 1], [slot])
        assert got is slot and owned_output_bytes(stub_lib) == before  # written there by the runtime
        np.testing.assert_array_equal(slot, want + 2)  # 2 * (x + 1) + 1
    finally:
        model.close()


def test_an_array_unlike_the_runtimes_output_is_not_written_into(stub_lib: Path, tmp_path: Path) -> None:
    """Quantized outputs come as stored int8: a float32 array (or a non-contiguous one) is no place
    for them; the output comes back as the runtime's own, the array untouched."""
    model = RknnrtBackend(stub_lib, RK3588, None).open(
        write_stub_model(tmp_path / "q.rknn", outputs=[QUANT_OUT], a=1.3, b=0.0), RuntimeOptions()
    )
    try:
        x = np.linspace(-50, 60, 12, dtype=np.float32).reshape(1, 3, 2, 2)
        (want,) = model.run([x], [InputFormat(layout="NCHW")])
        for unlike in (np.zeros((1, 3, 2, 2), np.float32), np.zeros((1, 3, 2, 4), np.int8)[..., ::2]):
            (got,) = model.run_into([x], [unlike], [InputFormat(layout="NCHW")])
            assert got is not unlike and not unlike.any()
            np.testing.assert_array_equal(got, want)
        int8_slot = np.zeros((1, 3, 2, 2), np.int8)
        (got,) = model.run_into([x], [int8_slot], [InputFormat(layout="NCHW")])
        assert got is int8_slot
        np.testing.assert_array_equal(int8_slot, want)
    finally:
        model.close()


@pytest.mark.parametrize("output", [FLOAT_OUT, QUANT_OUT], ids=["float", "int8"])
def test_the_zero_copy_api_reads_outputs_in_place_into_the_callers_arrays(
    stub_mrt_lib: Path, tmp_path: Path, output: StubTensor
) -> None:
    """librknnmrt's outputs sit in the runtime's memory: run_into lays them out (dequantized) straight
    into the caller's array, and run() hands out copies that the next run does not write over."""
    model = RknnrtBackend(stub_mrt_lib, PlatformInfo(soc="rv1106"), None).open(
        write_stub_model(tmp_path / "m.rknn", outputs=[output], a=1.0, b=0.0), RuntimeOptions()
    )
    try:
        x = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
        (first,) = model.run([x])
        kept = first.copy()
        (second,) = model.run([x + 4])
        np.testing.assert_array_equal(first, kept)  # not the runtime's memory, which run 2 rewrote
        assert not np.array_equal(first, second)
        slot = np.full(first.shape, np.nan, np.float32)
        (got,) = model.run_into([x + 4], [slot])
        assert got is slot
        np.testing.assert_array_equal(slot, second)
    finally:
        model.close()
