from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rknn_server.runtime.base import BackendError
from rknn_server.runtime.rknnrt.library import RuntimeLibrary, embedded_version, find_runtime_library


def _place(root: Path, relative: str, source: Path) -> Path:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    return target


def test_find_in_documented_order(tmp_path: Path, stub_lib: Path, stub_mrt_lib: Path) -> None:
    assert find_runtime_library(tmp_path, None) is None
    oem = _place(tmp_path, "oem/usr/lib/librknnmrt.so", stub_mrt_lib)
    assert find_runtime_library(tmp_path, None) == oem
    vendor = _place(tmp_path, "vendor/lib64/librknnrt.so", stub_lib)
    assert find_runtime_library(tmp_path, None) == vendor
    usr = _place(tmp_path, "usr/lib/librknnrt.so", stub_lib)
    assert find_runtime_library(tmp_path, None) == usr


def test_explicit_path_wins(tmp_path: Path, stub_lib: Path) -> None:
    _place(tmp_path, "usr/lib/librknnrt.so", stub_lib)
    assert find_runtime_library(tmp_path, stub_lib) == stub_lib
    assert find_runtime_library(tmp_path, tmp_path / "nowhere.so") is None


def test_kinds_and_versions(stub_lib: Path, stub_mrt_lib: Path) -> None:
    rt, mrt = RuntimeLibrary(stub_lib), RuntimeLibrary(stub_mrt_lib)
    assert (rt.kind, rt.has_general_api) == ("librknnrt", True)
    assert (mrt.kind, mrt.has_general_api) == ("librknnmrt", False)
    assert "rknn_set_io_mem" in mrt.symbols and "rknn_inputs_set" not in mrt.symbols
    assert rt.version == "2.3.2 (stub0000@2025-04-09T09:08:16)"


def test_version_string_across_chunk_boundary(tmp_path: Path) -> None:
    blob = tmp_path / "lib.so"
    blob.write_bytes(b"\0" * ((1 << 20) - 10) + b"librknnrt version: 1.6.0 (abc@2024)\0tail")
    assert embedded_version(blob) == "1.6.0 (abc@2024)"
    blob.write_bytes(b"\0" * 100)
    assert embedded_version(blob) == "unknown"


def test_not_a_runtime(tmp_path: Path) -> None:
    bogus = tmp_path / "librknnrt.so"
    bogus.write_text("text")
    with pytest.raises(BackendError, match="cannot load"):
        RuntimeLibrary(bogus)
    libm = Path("/lib/x86_64-linux-gnu/libm.so.6")
    if libm.exists():
        with pytest.raises(BackendError, match="lacks rknn_init"):
            RuntimeLibrary(libm)
