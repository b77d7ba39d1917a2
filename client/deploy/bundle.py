"""The offline bundle: every wheel the daemon needs on the board, built on the PC.

The board needs no network: this PC downloads binary wheels for the board's architecture, Python and
glibc (`pip download --only-binary=:all: --platform ...`), plus a wheel of this project and one of pip
itself, which installs them on the board. pip evaluates environment markers against the interpreter it
runs on, not the target (pypa/pip#11010: a Python 3.10 board's `tomli` went missing from a bundle made
on 3.11), so the requirements are resolved here: each round downloads the requirements known so far
without their dependencies, reads each wheel's own requirements, evaluates their markers for the board,
until no new one appears. armv7l boards take numpy from their distribution (PyPI has no armv7l wheel).
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rknn_client import __version__
from rknn_client.deploy.board import DIST_NAME, BoardFacts, DeployError

# The oldest glibc manylinux wheels target (manylinux2014 = glibc 2.17).
_OLDEST_GLIBC_MINOR = 17
_PIP_SECONDS = 900
_SOURCE_ROOT = Path(__file__).resolve().parents[2]
_MAX_ROUNDS = 10
# On armv7l these come from the board's distribution (python3-numpy), into a --system-site-packages venv.
SYSTEM_PACKAGES = {"armv7l": ("numpy",)}


@dataclass(frozen=True)
class Bundle:
    """A folder of wheels for one board. Without dependencies it holds only this project's wheel and pip
    (the board's Python must then already provide grpcio and the rest)."""

    directory: Path
    version: str
    project_wheel: str
    pip_wheel: str
    with_dependencies: bool = True
    system_site_packages: bool = False  # the venv sees the distribution's packages (SYSTEM_PACKAGES)


BundleBuilder = Callable[[BoardFacts, Path], Bundle]


def platform_tags(facts: BoardFacts) -> list[str]:
    """The wheel platform tags the board runs, newest manylinux first; armv7l adds `linux_armv7l`, the
    tag PyPI's grpcio wheels for it carry."""
    major, _, minor = facts.libc_version.partition(".")
    newest = int(minor) if major == "2" and minor.isdigit() else _OLDEST_GLIBC_MINOR
    tags = [f"manylinux_2_{m}_{facts.arch}" for m in range(newest, _OLDEST_GLIBC_MINOR - 1, -1)]
    tags.append(f"manylinux2014_{facts.arch}")
    return [*tags, "linux_armv7l"] if facts.arch == "armv7l" else tags


def board_environment(facts: BoardFacts) -> dict[str, str]:
    """The marker environment of the board's python3 (its patch release is unknown: X.Y.0)."""
    return {
        "python_version": facts.python_tag,
        "python_full_version": f"{facts.python_tag}.0",
        "platform_machine": facts.arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def download_command(facts: BoardFacts, dest: Path, requirements: Iterable[str]) -> list[str]:
    """`pip download` of `requirements` alone (no dependencies: resolved by the caller), as wheels for
    the board."""
    python = facts.python_tag
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(dest),
    ]
    command += ["--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}"]
    command += ["--abi", "abi3", "--abi", "none"]
    for tag in platform_tags(facts):
        command += ["--platform", tag]
    return [*command, *requirements]


def wheel_requirements(wheel: Path, extras: set[str], environment: dict[str, str]) -> list[Requirement]:
    """The wheel's Requires-Dist whose markers hold on the board for `extras`, markers removed."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        meta = email.message_from_bytes(archive.read(name))
    wanted = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**environment, "extra": e}) for e in {"", *extras}):
            req.marker = None
            wanted.append(req)
    return wanted


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


def _add(wanted: dict[str, Requirement], requirements: Iterable[Requirement], skip: set[str]) -> None:
    for req in requirements:
        if canonicalize_name(req.name) not in skip:
            wanted.setdefault(str(req), req)


def _resolve(facts: BoardFacts, project: Path, dest: Path) -> None:
    """Download into `dest` every wheel `project[server]` needs on the board, markers evaluated there."""
    environment = board_environment(facts)
    skip: set[str] = {canonicalize_name(n) for n in (DIST_NAME, *SYSTEM_PACKAGES.get(facts.arch, ()))}
    wanted = {"pip": Requirement("pip")}
    _add(wanted, wheel_requirements(project, {"server"}, environment), skip)
    for _ in range(_MAX_ROUNDS):
        round_dir = Path(tempfile.mkdtemp(prefix="round-", dir=dest))
        _pip(
            download_command(facts, round_dir, sorted(wanted)),
            f"downloading wheels for {facts.arch} Python {facts.python_tag}",
        )
        extras: dict[str, set[str]] = {}
        for req in wanted.values():
            extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
        before = len(wanted)
        for wheel in round_dir.glob("*.whl"):
            name = canonicalize_name(wheel.name.split("-")[0])
            _add(wanted, wheel_requirements(wheel, extras.get(name, set()), environment), skip)
        if len(wanted) == before:
            for wheel in round_dir.glob("*.whl"):
                shutil.move(wheel, dest / wheel.name)
            shutil.rmtree(round_dir)
            return
        shutil.rmtree(round_dir)
    raise DeployError(
        f"the dependencies of {project.name} did not settle in {_MAX_ROUNDS} rounds", "report this as a bug"
    )


def build_bundle(facts: BoardFacts, dest: Path) -> Bundle:
    """Download and build every wheel the board needs into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    _pip(project_wheel_command(dest), "building this project's wheel")
    project = only(dest, f"{DIST_NAME}-{__version__}-*.whl")
    _resolve(facts, project, dest)
    pip_wheel = only(dest, "pip-*.whl").name
    return Bundle(
        dest, __version__, project.name, pip_wheel, system_site_packages=facts.arch in SYSTEM_PACKAGES
    )
