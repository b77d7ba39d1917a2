"""The store's room: one quota, and the disk's free space, shared by complete models, the bytes of
abandoned partial uploads and the uploads in progress.

An upload claims its model's declared size when it begins (so concurrent uploads cannot overcommit)
and makes room by evicting, least recently used first, abandoned partial uploads and models no live
session has pinned. Partial uploads idle longer than `partial_ttl_s` are dropped whenever the store
looks. A cache on a disk smaller than its quota refuses clearly instead of filling it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import structlog

from rknn_server.config.limits import CacheLimits
from rknn_server.errors import Aborted, ResourceExhausted
from rknn_server.store.uploads import Claim

log = structlog.get_logger("rknn_server.cache")


@dataclass
class CacheStats:
    """Counts read by the metrics: uploads skipped as the model was cached (hits), models stored, evicted."""

    hits: int = 0
    stored: int = 0
    evictions: int = 0


@dataclass(frozen=True)
class _Entry:
    """A complete model or an abandoned partial upload, as a candidate for eviction."""

    path: Path
    size: int
    last_used: float


def _files(path: Path) -> list[os.stat_result]:
    """Stats of the data files of a model or partial folder (not the cache's dot files)."""
    return [f.stat() for f in path.iterdir() if f.is_file() and not f.name.startswith(".")]


def _last_activity(path: Path) -> float:
    return max([path.stat().st_mtime, *(st.st_mtime for st in _files(path))])


class Quota:
    """Claims of uploads in progress, pins of models in use, and the eviction that makes room."""

    def __init__(self, root: Path, limits: CacheLimits, stats: CacheStats) -> None:
        self._root = root
        self._limits = limits
        self._stats = stats
        self._lock = threading.Lock()
        self._claims: dict[str, Claim] = {}
        self._pins: Counter[str] = Counter()

    def claim(self, digest: str, claim: Claim) -> None:
        """The model's one upload in progress; another one at the same time is ABORTED."""
        with self._lock:
            if digest in self._claims:
                raise Aborted(
                    f"model {digest} is being uploaded by another call; call PrepareUpload again once it finishes"
                )
            self._claims[digest] = claim

    def release(self, digest: str) -> None:
        with self._lock:
            self._claims.pop(digest, None)

    def pin(self, digest: str) -> None:
        """A live session uses the model: it is not evicted until every pin is gone."""
        with self._lock:
            self._pins[digest] += 1

    def unpin(self, digest: str) -> None:
        with self._lock:
            self._pins[digest] -= 1
            if self._pins[digest] <= 0:
                del self._pins[digest]

    def pinned(self, digest: str) -> int:
        with self._lock:
            return self._pins[digest]

    def expire_partials(self) -> None:
        """Drop abandoned partial uploads idle for longer than partial_ttl_s."""
        ttl = self._limits.partial_ttl_s
        if ttl <= 0:
            return
        with self._lock:
            cutoff = time.time() - ttl
            for entry in self._partials():
                if entry.last_used < cutoff:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    log.info("partial_upload_expired", digest=entry.path.name[:12], bytes=entry.size)

    def make_room(self, digest: str) -> None:
        """Evict abandoned partial uploads and unpinned models, least recently used first, until
        every claimed upload fits both the quota and the disk's free space."""
        quota = self._limits.quota_bytes
        with self._lock:
            partials, models = self._partials(), self._models()
            used = sum(e.size for e in partials + models) + sum(c.declared for c in self._claims.values())
            pending = sum(max(0, c.declared - c.on_disk) for c in self._claims.values())
            free = shutil.disk_usage(self._root).free
            evictable = partials + [m for m in models if self._pins[m.path.name] <= 0]
            for entry in sorted(evictable, key=lambda e: e.last_used):
                if used <= quota and pending <= free:
                    break
                shutil.rmtree(entry.path, ignore_errors=True)
                used -= entry.size
                free += entry.size
                self._stats.evictions += entry.path.parent.name == "models"
                log.info(
                    "cache_evicted", path=f"{entry.path.parent.name}/{entry.path.name[:12]}", bytes=entry.size
                )
            declared = self._claims[digest].declared
            if used > quota:
                raise ResourceExhausted(
                    f"model cache is full: {used - declared} bytes held by models in use "
                    f"and uploads in progress, {declared} more needed, quota "
                    f"model_cache_quota_bytes={quota} (daemon option --cache-quota)"
                )
            if pending > free:
                raise ResourceExhausted(
                    f"the disk holding the model cache has {free} bytes free, and uploads in progress need "
                    f"{pending}; free space on the board or lower the quota (daemon option --cache-quota)"
                )

    def _partials(self) -> list[_Entry]:
        """Abandoned partial uploads (not claimed by a running upload). Call with the lock held."""
        entries = []
        for d in (self._root / "partial").iterdir():
            if d.name in self._claims or not d.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                entries.append(_Entry(d, sum(st.st_size for st in _files(d)), _last_activity(d)))
        return entries

    def _models(self) -> list[_Entry]:
        entries = []
        for d in (self._root / "models").iterdir():
            with contextlib.suppress(FileNotFoundError):
                entries.append(_Entry(d, sum(st.st_size for st in _files(d)), d.stat().st_mtime))
        return entries
