"""The offline bundle: every wheel the daemon needs on the board, built on the PC.

The board needs no network: this PC downloads binary wheels for the board's architecture, Python and
glibc (`pip download --only-binary=:all: --platform ...`), plus a wheel of this project and one of pip
itself, which installs them on the board.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rknn_client import __version__
from rknn_client.deploy.board import DIST_NAME, BoardFacts, DeployError

# The oldest glibc manylinux wheels target (manylinux2014 = glibc 2.17).
_OLDEST_GLIBC_MINOR = 17
_PIP_SECONDS = 900
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Bundle:
    """A folder of wheels for one board. Without dependencies it holds only this project's wheel and pip
    (the board's Python must then already provide grpcio and the rest)."""

    directory: Path
    version: str
    project_wheel: str
    pip_wheel: str
    with_dependencies: bool = True


BundleBuilder = Callable[[BoardFacts, Path], Bundle]


def platform_tags(facts: BoardFacts) -> list[str]:
    """The manylinux tags the board's glibc runs, newest first."""
    major, _, minor = facts.libc_version.partition(".")
    newest = int(minor) if major == "2" and minor.isdigit() else _OLDEST_GLIBC_MINOR
    tags = [f"manylinux_2_{m}_{facts.arch}" for m in range(newest, _OLDEST_GLIBC_MINOR - 1, -1)]
    return [*tags, f"manylinux2014_{facts.arch}"]


def download_command(facts: BoardFacts, dest: Path, project_wheel: Path) -> list[str]:
    """`pip download` of pip and of this project's `[server]` dependencies, as wheels for the board."""
    python = facts.python_tag
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest)]
    command += ["--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}"]
    for tag in platform_tags(facts):
        command += ["--platform", tag]
    return [*command, "pip", f"{project_wheel}[server]"]


def project_wheel_command(dest: Path) -> list[str]:
    """Build this project's wheel from its source tree; fetch the released one when installed from a wheel."""
    if (_SOURCE_ROOT / "pyproject.toml").is_file():
        return [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--wheel-dir",
            str(dest),
            str(_SOURCE_ROOT),
        ]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
            f"rknn-server-oss=={__version__}"]  # fmt: skip


def _pip(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_SECONDS, check=False)
    if result.returncode != 0:
        raise DeployError(
            f"{what} failed: {(result.stderr or result.stdout).strip()[-2000:]}",
            "this PC needs network access to PyPI to build the bundle (the board does not)",
        )


def only(dest: Path, pattern: str) -> Path:
    """The single file in `dest` matching `pattern`."""
    found = sorted(dest.glob(pattern))
    if len(found) != 1:
        raise DeployError(
            f"expected one {pattern} in {dest}, found {len(found)}", "remove the folder and retry"
        )
    return found[0]


def build_bundle(facts: BoardFacts, dest: Path) -> Bundle:
    """Download and build every wheel the board needs into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    _pip(project_wheel_command(dest), "building this project's wheel")
    project = only(dest, f"{DIST_NAME}-{__version__}-*.whl")
    _pip(
        download_command(facts, dest, project),
        f"downloading wheels for {facts.arch} Python {facts.python_tag}",
    )
    return Bundle(dest, __version__, project.name, only(dest, "pip-*.whl").name)
