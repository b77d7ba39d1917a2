"""Board images ship Python 3.10 to 3.12: the board-side packages must at least compile on 3.10."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def interpreter(version: str) -> str | None:
    """A real python<version> (pyenv shims that refuse to run do not count)."""
    candidates = [
        shutil.which(f"python{version}"),
        *map(str, Path.home().glob(f".pyenv/versions/{version}.*/bin/python")),
    ]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize("version", ["3.10", "3.12"])
def test_server_and_proto_compile_on_board_pythons(version: str, tmp_path: Path) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} interpreter here")
    for package in ("server", "proto"):
        result = subprocess.run(
            [python, "-m", "compileall", "-q", str(ROOT / package)],
            capture_output=True,
            text=True,
            env={"PYTHONPYCACHEPREFIX": str(tmp_path)},
        )
        assert result.returncode == 0, result.stdout + result.stderr
