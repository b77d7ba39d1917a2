"""Where RKNN-Toolkit2 lives: `RKNN_TOOLKIT2_PYTHON`, else the managed venv `rknn-client toolkit install` made.

The toolkit pins protobuf 4 and numpy 1 while this project needs protobuf 6+, so it never shares our
interpreter: what we find is another Python whose environment has `rknn-toolkit2` installed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rknn_client.user_cache import cache_root

ENV_PYTHON = "RKNN_TOOLKIT2_PYTHON"
DEFAULT_VERSION = "2.5.0"
INSTALL_HINT = (
    "run `rknn-client toolkit install` (or set RKNN_TOOLKIT2_PYTHON to a Python that has rknn-toolkit2)"
)
# Written last by the installer: a venv without it is a partial install and is not used.
STAMP = "rknn-client-toolkit.json"
PROBE_TIMEOUT_S = 60.0
_PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "print(m.version('rknn-toolkit2'))\n"
    "print(sys.version.split()[0])\n"
    "print('yes' if u.find_spec('rknn') else 'no')\n"
    "try:\n"
    "    m.version('torch'); print('real')\n"
    "except m.PackageNotFoundError:\n"
    "    print('stub' if u.find_spec('torch') else 'missing')\n"
)


@dataclass(frozen=True)
class Toolkit:
    """A usable toolkit: the interpreter to run the worker with, and what it has."""

    python: Path
    version: str
    python_version: str
    source: str  # how it was found, in words
    torch: str  # "real", "stub" (the --torch-stub stand-in: no torch distribution) or "missing"


@dataclass(frozen=True)
class Missing:
    """No usable toolkit, and why (shown to the user with INSTALL_HINT)."""

    reason: str

    def message(self) -> str:
        return f"RKNN-Toolkit2 is not available: {self.reason}; {INSTALL_HINT}"


def managed_dir(version: str = DEFAULT_VERSION, torch_stub: bool = False) -> Path:
    """Where `toolkit install` puts a version; the --torch-stub install has a folder of its own."""
    return cache_root() / (f"toolkit2-{version}" + ("-torch-stub" if torch_stub else ""))


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def probe(python: Path, source: str) -> Toolkit | Missing:
    """Ask `python` which rknn-toolkit2 it has (metadata only: importing rknn.api takes seconds)."""
    if not python.exists():
        return Missing(f"{source}: {python} does not exist")
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Missing(f"{source}: {python} did not answer within {PROBE_TIMEOUT_S:g}s")
    except OSError as error:
        return Missing(f"{source}: {python} cannot be run ({error.strerror})")
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 4:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "PackageNotFoundError" in last:
            return Missing(f"{source}: {python} has no rknn-toolkit2 installed")
        return Missing(f"{source}: {python} could not be asked for its rknn-toolkit2 version ({last})")
    if lines[2] != "yes":
        return Missing(f"{source}: {python} has rknn-toolkit2 metadata but no `rknn` package")
    return Toolkit(python=python, version=lines[0], python_version=lines[1], source=source, torch=lines[3])


def locate(version: str | None = None) -> Toolkit | Missing:
    """RKNN_TOOLKIT2_PYTHON wins when set (a wrong path is an error, not a fallback); then the managed
    venv of `version` (default: DEFAULT_VERSION, else the newest completed one); a full install before
    a --torch-stub one."""
    explicit = os.environ.get(ENV_PYTHON)
    if explicit:
        return probe(Path(explicit), f"{ENV_PYTHON}={explicit}")
    wanted = version or DEFAULT_VERSION
    candidates = [managed_dir(wanted), managed_dir(wanted, torch_stub=True)]
    if version is None and cache_root().is_dir():
        candidates += sorted(cache_root().glob("toolkit2-*"), reverse=True)
    for venv in candidates:
        if (venv / STAMP).is_file():
            return probe(venv_python(venv), f"managed venv {venv}")
    where = managed_dir(wanted)
    if where.exists():
        return Missing(f"{ENV_PYTHON} is not set and {where} is an unfinished install")
    return Missing(f"{ENV_PYTHON} is not set and there is no managed venv at {where}")
