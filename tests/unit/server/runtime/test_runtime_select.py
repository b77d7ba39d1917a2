"""What `--runtime auto|rknnrt` says when a runtime cannot start on a board: every cause named (where
the library was looked for, the NPU node, the host extra), no install command that cannot work, and a
library of another architecture named as such."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rknn_server.board.platform import PlatformInfo, probe_platform
from rknn_server.runtime.rknnrt.library import LIBRARY_DIRS, elf_machine
from rknn_server.runtime.select import BackendUnavailable, select_backend
from tests.rknnrt.fake_sysfs import rk3588_board

# e_machine of an ELF header (little-endian, 64-bit): aarch64 stands in for a wrong-arch library on
# x86_64, x86_64 for one on an aarch64 machine.
_OTHER_ARCH = {"x86_64": ("aarch64", 183), "aarch64": ("x86_64", 62)}


def _foreign_library(path: Path) -> str:
    """An ELF shared object header of an architecture other than this machine's; returns its name."""
    ours = elf_machine(Path(sys.executable).resolve())
    if ours not in _OTHER_ARCH:
        pytest.skip(f"no foreign architecture chosen for {ours}")
    name, machine = _OTHER_ARCH[ours]
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + machine.to_bytes(2, "little")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + bytes(64 - len(header)))
    return name


def test_a_library_of_another_architecture_is_named_as_such(tmp_path: Path) -> None:
    board = rk3588_board(tmp_path / "board")
    theirs = _foreign_library(board / "usr/lib/librknnrt.so")
    with pytest.raises(BackendUnavailable) as raised:
        select_backend("rknnrt", "", None, probe=probe_platform(board))
    message = str(raised.value)
    assert f"librknnrt.so is built for {theirs} but this daemon runs on" in message
    assert "No such file" not in message


@pytest.mark.parametrize("missing", ["onnx", "onnxruntime"])
def test_auto_without_library_node_or_host_extra_names_every_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    # A [server]-only install: host.py imports without the extra, which only its models import.
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(BackendUnavailable) as raised:
        select_backend("auto", "", None, probe=PlatformInfo(root=tmp_path))
    message = str(raised.value)
    assert f"No module named {missing!r}" in message
    assert message.startswith("neither runtime can start (--runtime auto): rknnrt: no RKNN runtime library")
    assert all(str(tmp_path / folder) in message for folder in LIBRARY_DIRS)
    assert f"no NPU device node (/dev/dri/renderD*, /dev/rknpu) under {tmp_path}" in message
    assert "host: the host runtime (ONNX Runtime on the CPU) needs the project's host extra" in message
    assert "rknn-server-oss[host]" not in message  # not on PyPI: that command cannot work


def test_auto_with_a_library_but_no_npu_node_falls_back_to_host_saying_why(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    library = tmp_path / "usr/lib/librknnrt.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    _, reason = select_backend("auto", "", None, probe=PlatformInfo(root=tmp_path))
    assert reason.startswith(f"{library} is present but no NPU device node")
    assert reason.endswith("serving the host runtime (ONNX Runtime on the CPU)")
