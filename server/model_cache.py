"""Content-addressed, on-disk model store with resumable uploads, a size quota and LRU eviction.

Layout under the root (created private, 0700):
    models/<digest>/<file name>     complete models, verified against their manifest
    partial/<digest>/<file sha256>  bytes of interrupted or running uploads, kept for resume
A model only appears under models/ by an atomic rename once every file's hash and the digest
verified, so a half-written model is never used. Bytes go to disk as they arrive: nothing holds
a whole model in memory. Models used by a live session are pinned and never evicted.
Before a session opens a model its files are hashed again against its digest (remembered per file
size and mtime, so a big model is hashed once, not on every open): a model damaged on disk is removed
instead of loaded. A full disk while caching discards the partial bytes and fails with a clear error.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rknn_proto import rknn_pb2
from rknn_proto.manifest import (
    HEX_DIGEST_PATTERN,
    FileEntry,
    entries_of,
    file_sha256,
    manifest_digest,
    valid_file_name,
)
from rknn_server.errors import (
    Aborted,
    DataLoss,
    InvalidInput,
    NotFound,
    ResourceExhausted,
)

_HASH_READ_BYTES = 1 << 20
# Names the main file of a complete model; a dot name, so no model file can collide with it.
MAIN_FILE_MARKER = ".main"


@dataclass(frozen=True)
class CacheLimits:
    quota_bytes: int = 16 << 30
    max_model_bytes: int = 8 << 30


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def validate_manifest(manifest: rknn_pb2.ModelManifest, limits: CacheLimits) -> None:
    """Reject a manifest that is malformed, inconsistent or too large, saying what was expected."""
    if not HEX_DIGEST_PATTERN.match(manifest.digest):
        raise InvalidInput(f"model digest {manifest.digest!r} is not 64 lower-case hex characters")
    if not manifest.files:
        raise InvalidInput("model manifest lists no files; expected the main model file first")
    names = [f.name for f in manifest.files]
    if len(set(names)) != len(names):
        raise InvalidInput(f"model manifest repeats a file name: {names}")
    for f in manifest.files:
        if not valid_file_name(f.name):
            raise InvalidInput(
                f"model file name {f.name!r} is not allowed; expected letters, digits, '.', '_' and '-' only"
            )
        if not HEX_DIGEST_PATTERN.match(f.sha256):
            raise InvalidInput(f"sha256 of {f.name!r} is not 64 lower-case hex characters")
    total = sum(f.size for f in manifest.files)
    if total > limits.max_model_bytes:
        raise ResourceExhausted(
            f"model is {total} bytes, over the limit max_model_bytes={limits.max_model_bytes}"
        )
    if total > limits.quota_bytes:
        raise ResourceExhausted(
            f"model is {total} bytes, over the model cache quota model_cache_quota_bytes={limits.quota_bytes}"
        )
    expected = manifest_digest(entries_of(manifest))
    if expected != manifest.digest:
        raise InvalidInput(
            f"model digest {manifest.digest} does not match its file list (expected {expected})"
        )


class Upload:
    """One running upload: appends chunks to the partial files, hashing as it goes."""

    def __init__(self, cache: ModelCache, manifest: rknn_pb2.ModelManifest, start_offsets: list[int]) -> None:
        self._cache = cache
        self.manifest = manifest
        self._dir = cache.partial_dir(manifest.digest)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._hashers = []
        self._written = []
        self.received_bytes = 0
        for f, start in zip(manifest.files, start_offsets, strict=True):
            path = self._dir / f.sha256
            hasher = hashlib.sha256()
            with path.open("ab+") as fh:
                fh.truncate(start)
                fh.seek(0)
                remaining = start
                while remaining:
                    block = fh.read(min(_HASH_READ_BYTES, remaining))
                    if not block:
                        raise DataLoss(
                            f"partial upload of {f.name!r} is shorter than {start} bytes; upload again"
                        )
                    hasher.update(block)
                    remaining -= len(block)
            self._hashers.append(hasher)
            self._written.append(start)
        self._handles: dict[int, BinaryIO] = {}

    def write(self, file_index: int, offset: int, data: bytes) -> None:
        files = self.manifest.files
        if not 0 <= file_index < len(files):
            raise InvalidInput(f"chunk for file {file_index}; the manifest has {len(files)} file(s)")
        if offset != self._written[file_index]:
            raise InvalidInput(
                f"chunk of {files[file_index].name!r} at offset {offset}; expected offset {self._written[file_index]}"
            )
        end = offset + len(data)
        if end > files[file_index].size:
            raise InvalidInput(
                f"{files[file_index].name!r} received {end} bytes; the manifest declared {files[file_index].size}"
            )
        try:
            handle = self._handles.get(file_index)
            if handle is None:
                handle = self._handles[file_index] = (self._dir / files[file_index].sha256).open("ab")
            handle.write(data)
            handle.flush()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self._close_handles()
                shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._hashers[file_index].update(data)
        self._written[file_index] = end
        self.received_bytes += len(data)

    def finish(self) -> Path:
        """Verify every file and move the model into the store; returns its main file."""
        self._close_handles()
        for f, written, hasher in zip(self.manifest.files, self._written, self._hashers, strict=True):
            if written != f.size:
                raise InvalidInput(
                    f"upload ended with {written} of {f.size} bytes of {f.name!r}; send the rest (it is kept for resume)"
                )
            actual = hasher.hexdigest()
            if actual != f.sha256:
                shutil.rmtree(self._dir, ignore_errors=True)
                raise DataLoss(
                    f"bytes of {f.name!r} hash to {actual}, not the declared sha256 {f.sha256}; "
                    "the partial upload was discarded"
                )
        return self._cache.commit(self.manifest)

    def _close_handles(self) -> None:
        handles = list(self._handles.values())
        self._handles.clear()
        for handle in handles:
            try:
                handle.close()
            except OSError:
                continue

    def close(self) -> None:
        self._close_handles()
        self._cache.end_upload(self.manifest.digest)


@dataclass
class CacheStats:
    """Counts read by the metrics: uploads skipped as the model was cached (hits), models stored, evicted."""

    hits: int = 0
    stored: int = 0
    evictions: int = 0


class ModelCache:
    def __init__(self, root: Path, limits: CacheLimits) -> None:
        self.root = root
        self.limits = limits
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._pins: Counter[str] = Counter()
        self._uploading: set[str] = set()
        # digest -> (size, mtime_ns) of each file when its hashes last verified.
        self._verified: dict[str, list[tuple[int, int]]] = {}
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)
        for sub in ("models", "partial", "staging"):
            (root / sub).mkdir(exist_ok=True, mode=0o700)
            os.chmod(root / sub, 0o700)
        shutil.rmtree(root / "staging", ignore_errors=True)
        (root / "staging").mkdir(mode=0o700)
        self._sweep()

    def _sweep(self) -> None:
        """Drop what a killed daemon may have left that is not a well-formed entry."""
        for sub, complete in (("models", True), ("partial", False)):
            for entry in (self.root / sub).iterdir():
                well_formed = entry.is_dir() and HEX_DIGEST_PATTERN.match(entry.name)
                if not well_formed or (complete and not (entry / MAIN_FILE_MARKER).is_file()):
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)

    def model_dir(self, digest: str) -> Path:
        return self.root / "models" / digest

    def partial_dir(self, digest: str) -> Path:
        return self.root / "partial" / digest

    def has(self, digest: str) -> bool:
        return (self.model_dir(digest) / MAIN_FILE_MARKER).is_file()

    def prepare(self, manifest: rknn_pb2.ModelManifest) -> tuple[bool, list[int]]:
        """(cached, held bytes per file) for a model about to be uploaded."""
        validate_manifest(manifest, self.limits)
        if self.has(manifest.digest):
            with self._lock:
                self.stats.hits += 1
            self.touch(manifest.digest)
            return True, [0] * len(manifest.files)
        partial = self.partial_dir(manifest.digest)
        held = []
        for f in manifest.files:
            path = partial / f.sha256
            held.append(min(path.stat().st_size, f.size) if path.is_file() else 0)
        return False, held

    def begin_upload(self, manifest: rknn_pb2.ModelManifest, start_offsets: list[int]) -> Upload:
        """Claim the model for this upload; a concurrent upload or a cache hit is ABORTED (ask again)."""
        validate_manifest(manifest, self.limits)
        with self._lock:
            if manifest.digest in self._uploading:
                raise Aborted(
                    f"model {manifest.digest} is being uploaded by another call; call PrepareUpload again "
                    "once it finishes"
                )
            self._uploading.add(manifest.digest)
        try:
            cached, held = self.prepare(manifest)
            if cached:
                raise Aborted(
                    f"model {manifest.digest} is already cached; call PrepareUpload again: no upload is needed"
                )
            if list(start_offsets) != held:
                raise InvalidInput(
                    f"upload starts at offsets {list(start_offsets)}; the daemon holds {held} bytes per file "
                    "(call PrepareUpload first and resume from what it returns)"
                )
            return Upload(self, manifest, list(start_offsets))
        except BaseException:
            self.end_upload(manifest.digest)
            raise

    def end_upload(self, digest: str) -> None:
        with self._lock:
            self._uploading.discard(digest)

    def commit(self, manifest: rknn_pb2.ModelManifest) -> Path:
        size = sum(f.size for f in manifest.files)
        self.make_room(size)
        partial = self.partial_dir(manifest.digest)
        staging = self.root / "staging" / manifest.digest
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir(mode=0o700)
            for f in manifest.files:
                src = partial / f.sha256
                with src.open("rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(src, staging / f.name)
            marker = staging / MAIN_FILE_MARKER
            marker.write_text(manifest.files[0].name)
            with marker.open("rb") as fh:
                os.fsync(fh.fileno())
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(partial, ignore_errors=True)
            raise
        target = self.model_dir(manifest.digest)
        if target.exists():
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
        shutil.rmtree(partial, ignore_errors=True)
        self.touch(manifest.digest)
        with self._lock:
            self.stats.stored += 1
        return target / manifest.files[0].name

    def main_file(self, digest: str) -> Path:
        """The main file of a cached model (marks it recently used)."""
        if not HEX_DIGEST_PATTERN.match(digest):
            raise InvalidInput(f"model digest {digest!r} is not 64 lower-case hex characters")
        marker = self.model_dir(digest) / MAIN_FILE_MARKER
        if not marker.is_file():
            raise NotFound(f"model {digest} is not in the daemon's cache; upload it first")
        self.touch(digest)
        return marker.parent / marker.read_text()

    def verify(self, digest: str) -> None:
        """Check a cached model's files against its digest before it is loaded; remove it if damaged."""
        folder = self.model_dir(digest)
        try:
            main = (folder / MAIN_FILE_MARKER).read_text()
            names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
            if main not in names:
                raise FileNotFoundError(main)
            paths = [folder / main, *(folder / n for n in names if n != main)]
            stamps = [(st.st_size, st.st_mtime_ns) for st in (p.stat() for p in paths)]
            if self._verified.get(digest) == stamps:
                return
            entries = [
                FileEntry(p.name, size, file_sha256(p)) for p, (size, _) in zip(paths, stamps, strict=True)
            ]
            intact = manifest_digest(entries) == digest
        except OSError:
            intact = False
        if intact:
            self._verified[digest] = stamps
            return
        self._verified.pop(digest, None)
        shutil.rmtree(folder, ignore_errors=True)
        raise DataLoss(
            f"model {digest} in the daemon's cache is damaged (its files no longer hash to its digest); "
            "it was removed: upload it again"
        )

    def touch(self, digest: str) -> None:
        now = time.time()
        os.utime(self.model_dir(digest), (now, now))

    def pin(self, digest: str) -> None:
        with self._lock:
            self._pins[digest] += 1

    def unpin(self, digest: str) -> None:
        with self._lock:
            self._pins[digest] -= 1
            if self._pins[digest] <= 0:
                del self._pins[digest]

    def make_room(self, incoming: int) -> None:
        """Evict least recently used, unpinned models until `incoming` bytes fit the quota."""
        with self._lock:
            models = [d for d in (self.root / "models").iterdir() if d.is_dir()]
            sizes = {d: _dir_size(d) for d in models}
            used = sum(sizes.values())
            for d in sorted(models, key=lambda p: p.stat().st_mtime):
                if used + incoming <= self.limits.quota_bytes:
                    break
                if self._pins[d.name] > 0:
                    continue
                shutil.rmtree(d, ignore_errors=True)
                used -= sizes[d]
                self.stats.evictions += 1
            if used + incoming > self.limits.quota_bytes:
                raise ResourceExhausted(
                    f"model cache is full: {used} bytes held by models in use, {incoming} more needed, "
                    f"quota model_cache_quota_bytes={self.limits.quota_bytes}"
                )
