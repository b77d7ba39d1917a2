"""What the cache remembers about a model's files when their hashes last verified, kept beside them.

A small JSON record in the model's folder (size, mtime_ns, inode and sha256 per file, and when they
were hashed) lets a restarted daemon trust files that have not changed since, instead of hashing
every model again; the periodic re-verification (--verify-interval) catches silent damage that keeps
the size and the times. A record that is missing, unreadable or does not describe the files as they
are now simply means: hash again.

Beside it, the model's owners: the identities that uploaded its bytes (in the order they did), who
alone may use it by digest. Unlike the record it is not advisory: one that is missing or unreadable
means the model has no owners (closed, not open), and an owner uploads it again to be one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD_FILE = ".verified"
# Names the main file of a complete model; a dot name, so no model file can collide with it.
MAIN_FILE_MARKER = ".main"
OWNERS_FILE = ".owners"
# Owners remembered per model, the most recent kept: an identity dropped beyond it uploads again.
MAX_OWNERS = 256


@dataclass(frozen=True)
class FileStamp:
    name: str
    size: int
    mtime_ns: int
    inode: int
    sha256: str


@dataclass(frozen=True)
class Record:
    verified_at: float  # unix time of the last full hash
    files: tuple[FileStamp, ...]

    def describes(self, stamps: list[tuple[str, int, int, int]]) -> bool:
        """Whether the files still have the names, sizes, mtimes and inodes they had when hashed."""
        return [(f.name, f.size, f.mtime_ns, f.inode) for f in self.files] == stamps


def stamp_of(path: Path) -> tuple[str, int, int, int]:
    st = path.stat()
    return path.name, st.st_size, st.st_mtime_ns, st.st_ino


def read_record(folder: Path) -> Record | None:
    try:
        raw = json.loads((folder / RECORD_FILE).read_text())
        return Record(float(raw["verified_at"]), tuple(FileStamp(**f) for f in raw["files"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_record(folder: Path, files: list[FileStamp], verified_at: float | None = None) -> None:
    """Replace the record atomically, keeping the folder's mtime (the cache's last-used time)."""
    record = Record(time.time() if verified_at is None else verified_at, tuple(files))
    _replace(
        folder,
        RECORD_FILE,
        json.dumps({"verified_at": record.verified_at, "files": [asdict(f) for f in record.files]}),
    )


def read_owners(folder: Path) -> tuple[str, ...]:
    """The identities that may use the model by digest, oldest first (none when unreadable)."""
    try:
        raw = json.loads((folder / OWNERS_FILE).read_text())
    except (OSError, ValueError):
        return ()
    return tuple(o for o in raw if isinstance(o, str)) if isinstance(raw, list) else ()


def write_owners(folder: Path, owners: tuple[str, ...]) -> Path:
    """Replace the owners atomically (the most recent `MAX_OWNERS`), keeping the folder's mtime;
    returns the file, for the caller to make durable."""
    return _replace(folder, OWNERS_FILE, json.dumps(list(owners[-MAX_OWNERS:])))


def _replace(folder: Path, name: str, text: str) -> Path:
    """Write `text` as `name` in `folder` by an atomic rename, keeping the folder's mtime (the
    cache's last-used time)."""
    before = folder.stat()
    tmp = folder / f"{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / name)
    os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
    return folder / name
