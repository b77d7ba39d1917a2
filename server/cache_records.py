"""What the cache remembers about a model's files when their hashes last verified, kept beside them.

A small JSON record in the model's folder (size, mtime_ns, inode and sha256 per file, and when they
were hashed) lets a restarted daemon trust files that have not changed since, instead of hashing
every model again; the periodic re-verification (--verify-interval) catches silent damage that keeps
the size and the times. A record that is missing, unreadable or does not describe the files as they
are now simply means: hash again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD_FILE = ".verified"


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
    before = folder.stat()
    record = Record(time.time() if verified_at is None else verified_at, tuple(files))
    tmp = folder / f"{RECORD_FILE}.tmp"
    tmp.write_text(
        json.dumps({"verified_at": record.verified_at, "files": [asdict(f) for f in record.files]})
    )
    os.replace(tmp, folder / RECORD_FILE)
    os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
