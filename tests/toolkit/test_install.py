"""`rknn-client toolkit install` and discovery, in a private cache dir (XDG_CACHE_HOME)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rknn_client.cli import main as cli_main
from rknn_client.toolkit import Missing, Toolkit, locate
from rknn_client.toolkit.locate import ENV_PYTHON, STAMP, managed_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    return tmp_path / "cache"


def test_a_failed_install_leaves_nothing_that_is_used(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    assert cli_main(["toolkit", "install", "--torch-stub", "--wheelhouse", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "installing rknn-toolkit2==2.5.0 failed" in err
    venv = managed_dir("2.5.0", torch_stub=True)
    assert venv.is_dir() and not (venv / STAMP).exists()
    found = locate()
    assert (
        isinstance(found, Missing) and "unfinished install" not in found.reason
    )  # the stub dir is not the default
    assert cli_main(["toolkit", "status"]) == 1


def test_an_interpreter_without_wheels_is_refused_before_anything_is_made(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "python3.13"
    fake.write_text("#!/bin/sh\necho 3 13\n")
    fake.chmod(0o755)
    assert cli_main(["toolkit", "install", "--python", str(fake)]) == 1
    err = capsys.readouterr().err
    assert "is Python 3.13" in err and "CPython 3.6-3.12" in err and "--python" in err
    assert not managed_dir().exists()


def test_a_missing_wheelhouse_is_named(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["toolkit", "install", "--wheelhouse", str(tmp_path / "nowhere")]) == 1
    assert f"--wheelhouse {tmp_path / 'nowhere'} is not a directory" in capsys.readouterr().err


def test_an_unfinished_managed_venv_is_not_used(cache: Path) -> None:
    managed_dir().mkdir(parents=True)
    found = locate()
    assert isinstance(found, Missing) and "unfinished install" in found.reason


def test_a_stamped_managed_venv_is_found(cache: Path, toolkit: Toolkit) -> None:
    """A finished install is found by its stamp; here the stamp points at the tests' real toolkit."""
    real = toolkit.python.parent.parent
    if not (real / "pyvenv.cfg").is_file():
        pytest.skip(f"the tests' toolkit {toolkit.python} is not in a venv")
    venv = managed_dir()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(toolkit.python)
    (venv / "lib").symlink_to(real / "lib")
    (venv / "pyvenv.cfg").write_bytes((real / "pyvenv.cfg").read_bytes())
    (venv / STAMP).write_text(json.dumps({"version": "2.5.0"}))
    found = locate()
    assert isinstance(found, Toolkit), found
    assert found.version == toolkit.version and found.source == f"managed venv {venv}"


def test_the_environment_variable_wins_and_is_never_a_silent_fallback(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_PYTHON, sys.executable)
    found = locate()
    assert isinstance(found, Missing) and f"{ENV_PYTHON}={sys.executable}" in found.reason
