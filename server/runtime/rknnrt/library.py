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

# ELF e_machine values of the architectures RKNN boards and their PCs run (ELF specification).
_ELF_MACHINES = {3: "x86 (i386)", 40: "32-bit ARM (armhf)", 62: "x86_64", 183: "aarch64", 243: "RISC-V"}
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


def elf_machine(path: Path) -> str | None:
    """The architecture an ELF file is built for (its header's e_machine), None when not ELF."""
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    machine = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return _ELF_MACHINES.get(machine, f"ELF machine {machine}")


def _wrong_architecture(path: Path) -> str:
    """Why `path` cannot load into this process when it is built for another architecture, else ''."""
    theirs, ours = elf_machine(path), elf_machine(Path("/proc/self/exe"))
    if theirs is None or ours is None or theirs == ours:
        return ""
    return (
        f"{path} is built for {theirs} but this daemon runs on {ours}: copy the runtime library built for "
        f"{ours} (the SDK ships one per architecture, e.g. runtime/Linux/librknn_api/aarch64/ and armhf/)"
    )


class RuntimeLibrary:
    """A loaded runtime library with its prototypes declared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as exc:
            raise BackendError(
                _wrong_architecture(path) or f"cannot load runtime library {path}: {exc}"
            ) from exc
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
