"""The stand-in librknnrt for each server: the project's C stub (tests/rknnrt/stub) as the tests build
it for ours, and cross-compiled for aarch64 with stand_in_extra.c for Rockchip's server."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.rknnrt.stub_build import STUB_DIR, build_stub

CROSS_COMPILER = "aarch64-linux-gnu-gcc"  # Debian's gcc-aarch64-linux-gnu, with libc6-dev-arm64-cross
EXTRA = Path(__file__).with_name("stand_in_extra.c")
RENAMED = "-Drknn_init=stub_rknn_init_by_path"  # stand_in_extra.c defines rknn_init around it


def host_stand_in(folder: Path) -> Path:
    return build_stub(folder)


def _compile(*args: str) -> None:
    run = subprocess.run(
        [CROSS_COMPILER, "-fPIC", "-O1", "-Wall", "-Werror", *args], capture_output=True, text=True
    )
    if run.returncode != 0:
        raise RuntimeError(f"{CROSS_COMPILER} {' '.join(args)} failed: {run.stderr[-2000:]}")


def aarch64_stand_in(folder: Path) -> Path:
    """`folder`/librknnrt.so for aarch64 (the folder is laid over the namespace's /usr/lib)."""
    folder.mkdir(parents=True, exist_ok=True)
    stub, extra, out = folder / "stub.o", folder / "extra.o", folder / "librknnrt.so"
    _compile(RENAMED, "-c", "-o", str(stub), str(STUB_DIR / "rknn_stub.c"))
    _compile(f"-I{STUB_DIR}", "-c", "-o", str(extra), str(EXTRA))
    _compile("-shared", "-o", str(out), str(stub), str(extra), "-lm")
    stub.unlink()
    extra.unlink()
    return out
