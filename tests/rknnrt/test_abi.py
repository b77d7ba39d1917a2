"""Struct layouts against rknn_api.h's documented sizes and offsets, and against a real armhf compiler."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from rknn_server.runtime.rknnrt.abi import ARMHF, NATIVE, Abi
from tests.rknnrt.stub_build import STUB_DIR

# (struct, size on x86_64/aarch64, size on armhf), from the SDK 2.3.2 header (anchor-rknn.md 2.3).
SIZES = [
    ("rknn_input_output_num", 8, 8),
    ("rknn_tensor_attr", 376, 376),
    ("rknn_input_range", 33040, 33040),
    ("rknn_perf_detail", 16, 16),
    ("rknn_perf_run", 8, 8),
    ("rknn_sdk_version", 512, 512),
    ("rknn_mem_size", 64, 64),
    ("rknn_custom_string", 1024, 1024),
    ("rknn_tensor_mem", 40, 40),
    ("rknn_input", 32, 24),
    ("rknn_output", 24, 16),
    ("rknn_init_extend", 136, 132),
    ("rknn_run_extend", 24, 24),
    ("rknn_output_extend", 8, 8),
]
OFFSETS_64 = {
    "rknn_tensor_attr": {
        "index": 0,
        "n_dims": 4,
        "dims": 8,
        "name": 72,
        "n_elems": 328,
        "size": 332,
        "fmt": 336,
        "type": 340,
        "qnt_type": 344,
        "fl": 348,
        "zp": 352,
        "scale": 356,
        "w_stride": 360,
        "size_with_stride": 364,
        "pass_through": 368,
        "h_stride": 372,
    },
    "rknn_mem_size": {
        "total_weight_size": 0,
        "total_internal_size": 4,
        "total_dma_allocated_size": 8,
        "total_sram_size": 16,
        "free_sram_size": 20,
        "reserved": 24,
    },
    "rknn_tensor_mem": {
        "virt_addr": 0,
        "phys_addr": 8,
        "fd": 16,
        "offset": 20,
        "size": 24,
        "flags": 28,
        "priv_data": 32,
    },
    "rknn_input": {"index": 0, "buf": 8, "size": 16, "pass_through": 20, "type": 24, "fmt": 28},
    "rknn_output": {"want_float": 0, "is_prealloc": 1, "index": 4, "buf": 8, "size": 16},
    "rknn_init_extend": {
        "ctx": 0,
        "real_model_offset": 8,
        "real_model_size": 12,
        "model_buffer_fd": 16,
        "model_buffer_flags": 20,
        "reserved": 24,
    },
    "rknn_run_extend": {"frame_id": 0, "non_block": 8, "timeout_ms": 12, "fence_fd": 16},
}
OFFSETS_ARMHF = {"rknn_input": {"index": 0, "buf": 4, "size": 8, "pass_through": 12, "type": 16, "fmt": 20}}
ARM_CC = "arm-linux-gnueabihf-gcc"


def _by_name(abi: Abi) -> dict[str, type[ctypes.Structure]]:
    return {struct.__name__: struct for struct in abi.structs()}


def _offsets(struct: type[ctypes.Structure]) -> dict[str, int]:
    return {name: getattr(struct, name).offset for name, *_ in struct._fields_}


def test_armhf_layout_matches_documented_sizes() -> None:
    structs = _by_name(ARMHF)
    assert {name: ctypes.sizeof(structs[name]) for name, _, _ in SIZES} == {
        name: size for name, _, size in SIZES
    }
    for name, offsets in OFFSETS_ARMHF.items():
        assert _offsets(structs[name]) == offsets


@pytest.mark.skipif(
    ctypes.sizeof(ctypes.c_void_p) != 8, reason="the native layout is LP64 only on 64-bit hosts"
)
def test_native_layout_matches_documented_lp64() -> None:
    structs = _by_name(NATIVE)
    assert {name: ctypes.sizeof(structs[name]) for name, _, _ in SIZES} == {
        name: size for name, size, _ in SIZES
    }
    for name, offsets in OFFSETS_64.items():
        assert _offsets(structs[name]) == offsets
    assert ctypes.sizeof(NATIVE.context) == 8


def static_asserts(abi: Abi) -> str:
    """C assertions that `abi`'s sizes and offsets are what the compiler gives for the stub header."""
    lines = [
        "#include <stddef.h>",
        '#include "rknn_stub_api.h"',
        f'_Static_assert(sizeof(rknn_context) == {ctypes.sizeof(abi.context)}, "rknn_context");',
    ]
    for struct in abi.structs():
        name = struct.__name__
        lines.append(f'_Static_assert(sizeof({name}) == {ctypes.sizeof(struct)}, "sizeof {name}");')
        for field, offset in _offsets(struct).items():
            lines.append(f'_Static_assert(offsetof({name}, {field}) == {offset}, "{name}.{field}");')
    return "\n".join(lines) + "\n"


def _compile(cc: str, source: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cc, "-c", "-ffreestanding", "-I", str(STUB_DIR), "-o", str(source.with_suffix(".o")), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.skipif(
    shutil.which(ARM_CC) is None, reason=f"{ARM_CC} not installed (apt package gcc-arm-linux-gnueabihf)"
)
def test_armhf_layout_against_cross_compiler(tmp_path: Path) -> None:
    source = tmp_path / "armhf_layout.c"
    source.write_text(static_asserts(ARMHF))
    result = _compile(ARM_CC, source)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="host compiler must be LP64")
def test_native_layout_against_host_compiler(tmp_path: Path) -> None:
    source = tmp_path / "native_layout.c"
    source.write_text(static_asserts(NATIVE))
    result = _compile("cc", source)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(
    shutil.which(ARM_CC) is None, reason=f"{ARM_CC} not installed (apt package gcc-arm-linux-gnueabihf)"
)
def test_cross_check_detects_a_wrong_layout(tmp_path: Path) -> None:
    source = tmp_path / "wrong_layout.c"
    source.write_text(static_asserts(NATIVE))  # the 64-bit layout is wrong for armhf
    assert _compile(ARM_CC, source).returncode != 0
