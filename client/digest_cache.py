"""The client's memory of file digests, so that uploading an unchanged model again skips hashing it.

A small JSON file under the user's cache folder (``$XDG_CACHE_HOME/rknn_client/digests.json``, by
default ``~/.cache/rknn_client``) maps a file's absolute path to its sha256 together with what the
file looked like when hashed: size, mtime_ns, ctime_ns and inode. A file whose stat differs in any
of them is hashed again (ctime cannot be set back by tools that restore mtime). The file is
replaced atomically and keeps the most recently used `MAX_ENTRIES`; a missing or unreadable one
only means hashing again. Small files are not remembered: hashing them costs less than the lookup.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from rknn_client.user_cache import cache_root
from rknn_proto.manifest import file_sha256

MAX_ENTRIES = 256
MIN_FILE_BYTES = 1 << 20
FILE_NAME = "digests.json"


# Tests point this at a file of their own, so that they neither read nor fill the user's.
PATH_ENV = "RKNN_CLIENT_DIGEST_CACHE"


def cache_file() -> Path:
    override = os.environ.get(PATH_ENV)
    return Path(override) if override else cache_root() / FILE_NAME


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class DigestCache:
    """Digests remembered across client processes; `sha256` is `file_sha256` with that memory."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_file()
        self._entries: dict[str, dict[str, object]] | None = None

    def _load(self) -> dict[str, dict[str, object]]:
        if self._entries is None:
            try:
                raw = json.loads(self.path.read_text())
                self._entries = (
                    {k: v for k, v in raw.items() if isinstance(v, dict)} if isinstance(raw, dict) else {}
                )
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def sha256(self, path: Path, progress: Callable[[int], None] | None = None) -> str:
        """The file's sha256, from memory when the file is unchanged since it was hashed."""
        before = path.stat()
        if before.st_size < MIN_FILE_BYTES:
            return file_sha256(path, progress)
        key = str(path.resolve())
        entries = self._load()
        known = entries.get(key)
        if (
            known is not None
            and known.get("stamp") == _stamp(before)
            and isinstance(known.get("sha256"), str)
        ):
            entries[key] = entries.pop(key)  # most recently used last
            if progress is not None:
                progress(before.st_size)
            return str(known["sha256"])
        digest = file_sha256(path, progress)
        if _stamp(path.stat()) == _stamp(before):  # not remembered if it changed while hashed
            entries.pop(key, None)
            entries[key] = {"stamp": _stamp(before), "sha256": digest}
            while len(entries) > MAX_ENTRIES:
                del entries[next(iter(entries))]
            self._save(entries)
        return digest

    def _save(self, entries: dict[str, dict[str, object]]) -> None:
        """Replace the file atomically; a cache that cannot be written is only a cache."""
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(entries, fh)
                os.replace(tmp, self.path)
            except OSError:
                Path(tmp).unlink(missing_ok=True)
                raise
