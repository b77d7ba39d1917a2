"""deploy's offline bundle is built for the board, not this PC: markers evaluated for the board's
Python and architecture. These tests download wheels from PyPI (network), each bounded by its timeout;
the bundle is then proven complete by an offline pip resolution."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from rknn_client.deploy.board import BoardFacts
from rknn_client.deploy.bundle import build_bundle


def _names(folder: Path) -> dict[str, str]:
    return {canonicalize_name(w.name.split("-")[0]): w.name for w in folder.glob("*.whl")}


@pytest.mark.timeout(400)
def test_a_python_3_10_aarch64_bundle_holds_tomli_and_installs_offline(tmp_path: Path) -> None:
    """Network: PyPI. A 3.11+ PC used to leave out tomli (required below 3.11)."""
    facts = BoardFacts("s", "aarch64", False, (3, 10), "glibc", "2.35", "", None)
    bundle = build_bundle(facts, tmp_path / "bundle")
    wheels = _names(bundle.directory)
    assert {"tomli", "grpcio", "numpy", "uvloop", "structlog", "h11", "pip"} <= set(wheels)
    assert "cp310" in wheels["grpcio"] and "aarch64" in wheels["grpcio"]
    offline = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(bundle.directory)]
    offline += ["--dry-run", "--python-version", "3.10", "--platform", "manylinux2014_aarch64"]
    offline += ["--only-binary=:all:", "--target", str(tmp_path / "x"), "--ignore-installed"]
    result = subprocess.run(
        [*offline, f"{bundle.directory / bundle.project_wheel}[server]", "tomli"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(400)
def test_an_armv7l_bundle_takes_pypi_grpcio_and_leaves_numpy_to_the_board(tmp_path: Path) -> None:
    """Network: PyPI. grpcio has linux_armv7l wheels; numpy has none (the board's python3-numpy is used);
    uvloop's marker excludes armv7l."""
    facts = BoardFacts("s", "armv7l", False, (3, 11), "glibc", "2.36", "", None)
    wheels = _names(build_bundle(facts, tmp_path / "bundle").directory)
    assert "linux_armv7l" in wheels["grpcio"] and "protobuf" in wheels
    assert "numpy" not in wheels and "uvloop" not in wheels
