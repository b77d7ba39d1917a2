"""Finding and loading librknnrt.so / librknnmrt.so."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from rknn_server.runtime.base import BackendError
from rknn_server.runtime.rknnrt import abi

# The documented install places, in the order the toolkit's docs mention them.
LIBRARY_DIRS = ("usr/lib", "usr/lib64", "vendor/lib64", "vendor/lib", "oem/usr/lib")
LIBRARY_NAMES = ("librknnrt.so", "librknnmrt.so")

_VERSION_RE = re.compile(rb"librknnm?rt version: ([\x20-\x7e]+)")
_SCAN_CHUNK = 1 << 20


def find_runtime_library(root: Path, explicit: Path | None) -> Path | None:
    """The runtime library to load: `explicit` when given (and present), else the first one found
    under `root` in the documented directories."""
    if explicit is not None:
        return explicit if explicit.is_file() else None
    for folder in LIBRARY_DIRS:
        for name in LIBRARY_NAMES:
            candidate = root / folder / name
            if candidate.is_file():
                return candidate
    return None


def embedded_version(path: Path) -> str:
    """The `librknnrt version: ...` string compiled into the library (what `strings | grep` shows)."""
    tail = b""
    with path.open("rb") as handle:
        while chunk := handle.read(_SCAN_CHUNK):
            match = _VERSION_RE.search(tail + chunk)
            if match:
                return match.group(1).decode("ascii").strip()
            tail = chunk[-256:]
    return "unknown"


class RuntimeLibrary:
    """A loaded runtime library with its prototypes declared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as exc:
            raise BackendError(f"cannot load runtime library {path}: {exc}") from exc
        self.symbols = abi.declare(self.cdll)
        missing = [name for name in abi.REQUIRED_SYMBOLS if name not in self.symbols]
        if missing:
            raise BackendError(f"{path} is not an RKNN runtime: it lacks {', '.join(missing)}")
        self.version = embedded_version(path)

    @property
    def has_general_api(self) -> bool:
        """False for librknnmrt (RV1103/RV1106), which only offers the zero-copy API."""
        return all(name in self.symbols for name in abi.GENERAL_API_SYMBOLS)

    @property
    def kind(self) -> str:
        return "librknnrt" if self.has_general_api else "librknnmrt"
