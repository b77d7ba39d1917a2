"""The ABI test (tests/rknnrt/test_abi.py) on the board's own Python, and the layouts the board's
ctypes computes checked by the board architecture's real compiler (the cross compiler here: the
minimal image has none)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.board.conftest import ReadyBoard
from tests.board.rootfs import BOARD_PYTEST, BOARD_VENV, ROOT

SOURCE = "/opt/board-test/src"
# Its compiler tests need a compiler on the board; the layouts are compiled below instead.
DESELECTED = "tests/rknnrt/test_abi.py::test_native_layout_against_host_compiler"


def copy_abi_test(ready: ReadyBoard) -> None:
    source = ready.board.path(SOURCE)
    (source / "tests" / "rknnrt").mkdir(parents=True, exist_ok=True)
    for relative in (
        "tests/__init__.py",
        "tests/rknnrt/__init__.py",
        "tests/rknnrt/test_abi.py",
        "tests/rknnrt/stub_build.py",
    ):
        shutil.copy2(ROOT / relative, source / relative)
    shutil.copytree(ROOT / "tests/rknnrt/stub", source / "tests/rknnrt/stub", dirs_exist_ok=True)


def test_the_abi_test_passes_on_the_board(ready_board: ReadyBoard) -> None:
    copy_abi_test(ready_board)
    python = f"cd {SOURCE} && PYTHONPATH={BOARD_PYTEST}:. {BOARD_VENV}/bin/python"
    result = ready_board.board.run(
        f"{python} -m pytest -q -p no:cacheprovider -rs tests/rknnrt/test_abi.py --deselect {DESELECTED}",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout
    # On a 64-bit board the LP64 layout is checked, on armhf only the armhf one; the cross-compiler
    # tests skip for want of arm-linux-gnueabihf-gcc on the board.
    passed = "2 passed" if ready_board.spec.machine == "aarch64" else "1 passed"
    assert passed in result.stdout, result.stdout
    assert "arm-linux-gnueabihf-gcc not installed" in result.stdout  # the skip reason


def test_the_boards_ctypes_layout_is_what_its_compiler_lays_out(
    ready_board: ReadyBoard, tmp_path: Path
) -> None:
    copy_abi_test(ready_board)
    program = (
        "from rknn_server.runtime.rknnrt.abi import NATIVE; "
        "from tests.rknnrt.test_abi import static_asserts; print(static_asserts(NATIVE), end='')"
    )
    asserts = ready_board.board.run(
        f'cd {SOURCE} && PYTHONPATH={BOARD_PYTEST}:. {BOARD_VENV}/bin/python -c "{program}"', timeout=300
    )
    assert asserts.returncode == 0, asserts.stdout
    source = tmp_path / "board_layout.c"
    source.write_text(asserts.stdout)
    compiler = ready_board.spec.cross_cc
    stub = ROOT / "tests/rknnrt/stub"
    command = [compiler, "-c", "-ffreestanding", "-I", str(stub), "-o", str(tmp_path / "l.o"), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert asserts.stdout.count("_Static_assert") > 50
