"""Content-addressed, on-disk model store with resumable uploads, a size quota and LRU eviction.

Layout under the root (created private, 0700):
    models/<digest>/<file name>     complete models, verified against their manifest
    partial/<digest>/<file name>    bytes of interrupted or running uploads, kept for resume
A model only appears under models/ by an atomic rename once every file's hash and the digest
verified, so a half-written model is never used. Bytes go to disk as they arrive (a file is created
by its first bytes, never from the header): nothing holds a whole model in memory.

The quota covers everything on disk: complete models, the partial bytes of abandoned uploads, and
the declared size of every upload in progress (reserved when it starts, so that concurrent uploads
cannot overcommit). A new upload first makes room by evicting, oldest first, unpinned models and
abandoned partial uploads; partial uploads idle longer than `partial_ttl_s` are dropped whenever the
cache looks. Models used by a live session are pinned and never evicted. The free space of the disk
is checked the same way, so a cache on a disk smaller than its quota refuses clearly instead of
filling it; a full disk while writing still discards that upload's bytes and fails with a clear error.

Files are written through the page cache and a committed model is synced to the disk in the
background (`rknn_server.store.durability`): its record is written only once it is durable, and until then
the stamps taken when it verified on arrival stand in for it, in memory.

Before a session opens a model its files are checked against their last verification (a record
beside them: size, mtime, inode and hash per file, kept across restarts); changed files are hashed
again. `verify_due` re-hashes models on a schedule and `verify_all` at start-up (--verify-cache):
a model damaged on disk is removed and reported instead of loaded.

Tenancy: content addressing shares the bytes, never the access. A model belongs to the identities
that uploaded its bytes (its owners, kept beside it across restarts, cache_records.py); a caller
named by the methods' `owner` sees it cached, resumes its partial upload and opens it only if it is
one, and is otherwise told exactly what it would be told of a model that is not there. Someone who
only knows a digest (or a manifest) gets no shortcut: PrepareUpload says "not cached, nothing
held" and the upload takes every byte, after which the uploader is an owner too. `owner=None` is the
daemon itself (the model repository, which shares its models by name): no owner is checked or made.
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

from rknn_proto import rknn_pb2
from rknn_proto.manifest import (
    FileEntry,
    entries_of,
    file_sha256,
    manifest_digest,
    valid_digest,
    valid_file_name,
)
from rknn_proto.reasons import Reason
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import (
    Aborted,
    DataLoss,
    InvalidInput,
    NotFound,
    ResourceExhausted,
)
from rknn_server.store.cache_records import (
    OWNERS_FILE,
    FileStamp,
    Record,
    read_owners,
    read_record,
    stamp_of,
    write_owners,
    write_record,
)
from rknn_server.store.durability import Syncer, sync_path
from rknn_server.store.uploads import UPLOADER_MARKER, Claim, Destination, Upload

log = structlog.get_logger("rknn_server.cache")
# Names the main file of a complete model; a dot name, so no model file can collide with it.
MAIN_FILE_MARKER = ".main"
# Damaged models remembered (digest -> when) so that a client asking for one hears why it is gone.
_DAMAGED_REMEMBERED = 256


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


@dataclass(frozen=True)
class CheckedManifest:
    """A manifest `validate_manifest` accepted, with its size: what the cache's steps of an upload
    take, so that each request's manifest is checked once, however many steps it goes through."""

    manifest: rknn_pb2.ModelManifest
    total_bytes: int

    @property
    def digest(self) -> str:
        return self.manifest.digest


def validate_manifest(manifest: rknn_pb2.ModelManifest, limits: CacheLimits) -> CheckedManifest:
    """Reject a manifest that is malformed, inconsistent or too large, saying what was expected.

    Runs before anything touches the disk; the count is checked before anything iterates the files."""
    if not valid_digest(manifest.digest):
        raise InvalidInput(f"model digest {manifest.digest[:80]!r} is not 64 lower-case hex characters")
    if not manifest.files:
        raise InvalidInput("model manifest lists no files; expected the main model file first")
    if len(manifest.files) > limits.max_model_files:
        raise ResourceExhausted(
            f"model manifest lists {len(manifest.files)} files, over the limit "
            f"max_model_files={limits.max_model_files} (daemon option --max-model-files)"
        )
    repeated = sorted(n for n, count in Counter(f.name for f in manifest.files).items() if count > 1)
    if repeated:
        raise InvalidInput(f"model manifest repeats file names {repeated[:5]}; expected each name once")
    for f in manifest.files:
        if not valid_file_name(f.name):
            raise InvalidInput(
                f"model file name {f.name[:200]!r} is not allowed; expected 1 to 128 letters, digits, "
                "'.', '_' and '-', not starting with '.' or '-'"
            )
        if not valid_digest(f.sha256):
            raise InvalidInput(
                f"sha256 of {f.name!r} ({f.sha256[:80]!r}) is not 64 lower-case hex characters"
            )
    total = sum(f.size for f in manifest.files)
    if total > limits.max_model_bytes:
        raise ResourceExhausted(
            f"model is {total} bytes, over the limit max_model_bytes={limits.max_model_bytes} "
            "(daemon option --max-model-bytes)"
        )
    if total > limits.quota_bytes:
        raise ResourceExhausted(
            f"model is {total} bytes, over the model cache quota "
            f"model_cache_quota_bytes={limits.quota_bytes} (daemon option --cache-quota)"
        )
    expected = manifest_digest(entries_of(manifest))
    if expected != manifest.digest:
        raise InvalidInput(
            f"model digest {manifest.digest} does not match its file list (expected {expected})"
        )
    return CheckedManifest(manifest, total)


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
        self._claims: dict[str, Claim] = {}
        self._damaged: dict[str, tuple[str, ...]] = {}  # digest -> its owners, when removed as damaged
        self._arrived: dict[str, Record] = {}  # committed, not yet durable: what was verified on arrival
        self._syncer = Syncer()
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)
        for sub in ("models", "partial", "staging"):
            (root / sub).mkdir(exist_ok=True, mode=0o700)
            os.chmod(root / sub, 0o700)
        shutil.rmtree(root / "staging", ignore_errors=True)
        (root / "staging").mkdir(mode=0o700)
        self._sweep()
        self.expire_partials()

    def _sweep(self) -> None:
        """Drop what a killed daemon may have left that is not a well-formed entry."""
        for sub, complete in (("models", True), ("partial", False)):
            for entry in (self.root / sub).iterdir():
                well_formed = entry.is_dir() and valid_digest(entry.name)
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

    def may_use(self, digest: str, owner: str | None) -> bool:
        """Whether the model is cached and `owner` may use it by digest (None: the daemon itself)."""
        if not (valid_digest(digest) and self.has(digest)):
            return False
        return owner is None or owner in read_owners(self.model_dir(digest))

    def grant(self, digest: str, owner: str) -> None:
        """Make `owner` an owner of a cached model: only once it proved it has the bytes."""
        folder = self.model_dir(digest)
        with self._lock:
            if not self.has(digest):
                raise self._not_cached(digest)
            owners = read_owners(folder)
            if owner in owners:
                return
            sync_path(write_owners(folder, (*owners, owner)))
            sync_path(folder)
        log.info("model_owner_added", digest=digest[:12], owner=owner)

    def prepare(self, manifest: rknn_pb2.ModelManifest, owner: str | None = None) -> tuple[bool, list[int]]:
        """(cached, held bytes per file) for a model about to be uploaded by `owner`: cached only for
        an owner, held only for the one who began the partial upload (anyone else sends every byte)."""
        return self._prepare(validate_manifest(manifest, self.limits), owner)

    def _prepare(self, checked: CheckedManifest, owner: str | None) -> tuple[bool, list[int]]:
        manifest = checked.manifest
        if self.may_use(manifest.digest, owner):
            with self._lock:
                self.stats.hits += 1
            self.touch(manifest.digest)
            return True, [0] * len(manifest.files)
        self.expire_partials()
        partial = self.partial_dir(manifest.digest)
        if not self._began(partial, owner):
            return False, [0] * len(manifest.files)
        held = []
        for f in manifest.files:
            path = partial / f.name
            held.append(min(path.stat().st_size, f.size) if path.is_file() else 0)
        return False, held

    @staticmethod
    def _began(partial: Path, owner: str | None) -> bool:
        """Whether `owner` began the partial upload in `partial` (the daemon itself may resume any)."""
        if owner is None:
            return True
        try:
            return (partial / UPLOADER_MARKER).read_text() == owner
        except OSError:
            return False

    def begin_upload(
        self, manifest: rknn_pb2.ModelManifest, start_offsets: list[int], owner: str | None = None
    ) -> Upload:
        """Claim the model for `owner`'s upload and reserve its room in the quota and on the disk.

        A concurrent upload, a cache hit (for an owner) or bytes that vanished since PrepareUpload is
        ABORTED (the client asks again); no room is RESOURCE_EXHAUSTED. A model cached for others only
        is uploaded in full, which makes `owner` an owner too."""
        return self._begin(validate_manifest(manifest, self.limits), start_offsets, owner)

    def _begin(self, checked: CheckedManifest, start_offsets: list[int], owner: str | None) -> Upload:
        manifest, digest = checked.manifest, checked.digest
        claim = Claim(declared=checked.total_bytes)
        with self._lock:
            if digest in self._claims:
                raise Aborted(
                    f"model {digest} is being uploaded by another call; call PrepareUpload again once it finishes"
                )
            self._claims[digest] = claim
        try:
            cached, held = self._prepare(checked, owner)
            if cached:
                raise Aborted(
                    f"model {digest} is already cached; call PrepareUpload again: no upload is needed"
                )
            if len(start_offsets) != len(held):
                raise InvalidInput(
                    f"upload header has {len(start_offsets)} start offsets for {len(held)} file(s); "
                    "expected one per file, as PrepareUpload returned them"
                )
            if any(start > have for start, have in zip(start_offsets, held, strict=True)):
                raise Aborted(  # its partial bytes were evicted or expired since PrepareUpload
                    f"upload starts at offsets {list(start_offsets)[:8]}; the daemon no longer holds them (it "
                    f"holds {held[:8]} bytes per file): call PrepareUpload again and resume from what it returns"
                )
            if list(start_offsets) != held:
                raise InvalidInput(
                    f"upload starts at offsets {list(start_offsets)[:8]}; the daemon holds {held[:8]} bytes per "
                    "file (call PrepareUpload first and resume from what it returns)"
                )
            claim.on_disk = sum(held)
            self._make_room(digest)
            destination = Destination(
                self.partial_dir(digest),
                commit=lambda: self.commit(manifest, owner),
                release=lambda: self.end_upload(digest),
            )
            return Upload(destination, manifest, list(start_offsets), claim, owner)
        except BaseException:
            self.end_upload(digest)
            raise

    def end_upload(self, digest: str) -> None:
        with self._lock:
            self._claims.pop(digest, None)

    def commit(self, manifest: rknn_pb2.ModelManifest, owner: str | None = None) -> Path:
        """Move a verified upload into the store (its room was reserved when it began); `owner`, who
        sent its bytes, is an owner of it from now on."""
        partial = self.partial_dir(manifest.digest)
        staging = self.root / "staging" / manifest.digest
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir(mode=0o700)
            stamps = []
            for f in manifest.files:
                src = partial / f.name
                if f.size == 0:
                    src.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    src.touch()
                os.replace(src, staging / f.name)
                stamps.append(FileStamp(*stamp_of(staging / f.name), f.sha256))
            (staging / MAIN_FILE_MARKER).write_text(manifest.files[0].name)
            write_owners(staging, () if owner is None else (owner,))
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(partial, ignore_errors=True)
            raise
        target = self.model_dir(manifest.digest)
        if target.exists():
            shutil.rmtree(staging)
            if owner is not None:
                self.grant(manifest.digest, owner)
        else:
            os.replace(staging, target)
            record = Record(time.time(), tuple(stamps))
            with self._lock:
                self._arrived[manifest.digest] = record
            self._syncer.submit(lambda: self._make_durable(manifest.digest, record))
        shutil.rmtree(partial, ignore_errors=True)
        with self._lock:
            self._damaged.pop(manifest.digest, None)
        self.touch(manifest.digest)
        with self._lock:
            self.stats.stored += 1
        return target / manifest.files[0].name

    def _make_durable(self, digest: str, record: Record) -> None:
        """In the syncer: sync a committed model's files, marker and folders, then write its record.
        A model evicted meanwhile is left alone; one that cannot be synced is removed (its bytes on
        the disk are not known to be the ones verified)."""
        folder = self.model_dir(digest)
        try:
            for path in (
                *(folder / f.name for f in record.files),
                folder / MAIN_FILE_MARKER,
                folder / OWNERS_FILE,
                folder,
                folder.parent,
            ):
                sync_path(path)
            if read_record(folder) is None and record.describes(
                [stamp_of(folder / f.name) for f in record.files]
            ):
                write_record(folder, list(record.files), record.verified_at)
        except FileNotFoundError:
            pass  # evicted or replaced since it was committed
        except OSError as exc:
            log.error("model_not_durable", digest=digest, error=exc.strerror, action="removed")
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            with self._lock:
                if self._arrived.get(digest) is record:
                    del self._arrived[digest]

    def _record(self, digest: str) -> Record | None:
        """What the cache last verified of a model: its record, else what it verified on arrival
        and has not yet made durable."""
        record = read_record(self.model_dir(digest))
        if record is None:
            with self._lock:
                record = self._arrived.get(digest)
        return record

    def close(self) -> None:
        """Make durable the models committed so far (at a clean stop)."""
        self._syncer.close()

    def adopt(self, manifest: rknn_pb2.ModelManifest, path: Path, owner: str) -> None:
        """Take a one-file model the daemon received whole (its bytes at `path`, moved, not copied) as
        `owner`'s upload of it: verified and committed, or, cached already, `owner` becomes an owner."""
        checked = validate_manifest(manifest, self.limits)
        if self._prepare(checked, owner)[0]:
            return
        upload = self._begin(checked, [0] * len(manifest.files), owner)
        try:
            upload.adopt(path)
            upload.finish()
        finally:
            upload.close()

    def main_file(self, digest: str, owner: str | None = None) -> Path:
        """The main file of a cached model `owner` may use (marks it recently used); to anyone else
        the model is as absent as one never uploaded."""
        if not valid_digest(digest):
            raise InvalidInput(f"model digest {digest[:80]!r} is not 64 lower-case hex characters")
        if not self.may_use(digest, owner):
            raise self._not_cached(digest, owner)
        marker = self.model_dir(digest) / MAIN_FILE_MARKER
        self.touch(digest)
        return marker.parent / marker.read_text()

    def _not_cached(self, digest: str, owner: str | None = None) -> NotFound:
        """What a caller hears of a model it may not use or that is not there: why it is gone only
        when it was one of the owners of a model removed as damaged."""
        owners = self._damaged.get(digest)
        if owners is not None and (owner is None or owner in owners):
            return NotFound(
                f"model {digest} was removed from the daemon's cache because its files were damaged "
                "(they no longer hashed to its digest); upload it again",
                reason=Reason.MODEL_NOT_CACHED,
            )
        return NotFound(
            f"model {digest} is not in the daemon's cache; upload it first",
            reason=Reason.MODEL_NOT_CACHED,
        )

    def verify(self, digest: str, rehash: bool = False) -> None:
        """Check a cached model's files against its digest; remove it (DATA_LOSS) if damaged.

        Files unchanged since their last verification (same size, mtime and inode) are trusted
        unless `rehash`."""
        folder = self.model_dir(digest)
        stamps: list[tuple[str, int, int, int]] = []
        hashes: list[str] = []
        started = time.monotonic()
        try:
            main = (folder / MAIN_FILE_MARKER).read_text()
            names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
            if main not in names:
                raise FileNotFoundError(main)
            paths = [folder / main, *(folder / n for n in names if n != main)]
            stamps = [stamp_of(p) for p in paths]
            record = self._record(digest)
            if not rehash and record is not None and record.describes(stamps):
                remembered = [FileEntry(f.name, f.size, f.sha256) for f in record.files]
                if manifest_digest(remembered) == digest:
                    return
            started = time.monotonic()
            hashes = [file_sha256(p) for p in paths]
        except OSError:
            if not folder.exists():
                raise self._not_cached(digest) from None
            hashes = []
        entries = [FileEntry(name, size, h) for (name, size, _, _), h in zip(stamps, hashes, strict=False)]
        intact = bool(hashes) and manifest_digest(entries) == digest
        if hashes:
            log.info(
                "model_hashed",
                digest=digest[:12],
                bytes=sum(e.size for e in entries),
                duration_ms=round((time.monotonic() - started) * 1000, 1),
                intact=intact,
            )
        if intact:
            with self._lock:
                syncing = digest in self._arrived  # its record follows once it is durable
            if not syncing:
                with contextlib.suppress(OSError):  # a record not written only means hashing again next time
                    write_record(folder, [FileStamp(*s, h) for s, h in zip(stamps, hashes, strict=True)])
            return
        self._remove_damaged(digest)
        raise DataLoss(
            f"model {digest} in the daemon's cache is damaged (its files no longer hash to its digest); "
            "it was removed: upload it again"
        )

    def _remove_damaged(self, digest: str) -> None:
        owners = read_owners(self.model_dir(digest))
        shutil.rmtree(self.model_dir(digest), ignore_errors=True)
        with self._lock:
            self._damaged[digest] = owners
            while len(self._damaged) > _DAMAGED_REMEMBERED:
                del self._damaged[next(iter(self._damaged))]
        log.error("model_damaged", digest=digest, action="removed; clients must upload it again")

    def cached_digests(self) -> list[str]:
        return sorted(d.name for d in (self.root / "models").iterdir() if self.has(d.name))

    def verify_all(self) -> list[str]:
        """Hash every cached model again; returns the digests found damaged (and removed)."""
        return self._verify([d for d in self.cached_digests()])

    def verify_due(self, max_age_s: float) -> list[str]:
        """Hash again the models last verified more than `max_age_s` ago; returns those found damaged."""
        now = time.time()
        due = []
        for digest in self.cached_digests():
            record = self._record(digest)
            if record is None or now - record.verified_at >= max_age_s:
                due.append(digest)
        return self._verify(due)

    def _verify(self, digests: list[str]) -> list[str]:
        damaged = []
        for digest in digests:
            try:
                self.verify(digest, rehash=True)
            except DataLoss:
                damaged.append(digest)
            except NotFound:
                continue  # evicted meanwhile
        return damaged

    def touch(self, digest: str) -> None:
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.model_dir(digest), (now, now))

    def pin(self, digest: str) -> None:
        with self._lock:
            self._pins[digest] += 1

    def unpin(self, digest: str) -> None:
        with self._lock:
            self._pins[digest] -= 1
            if self._pins[digest] <= 0:
                del self._pins[digest]

    def expire_partials(self) -> None:
        """Drop abandoned partial uploads idle for longer than partial_ttl_s."""
        ttl = self.limits.partial_ttl_s
        if ttl <= 0:
            return
        with self._lock:
            cutoff = time.time() - ttl
            for entry in self._partials():
                if entry.last_used < cutoff:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    log.info("partial_upload_expired", digest=entry.path.name[:12], bytes=entry.size)

    def _partials(self) -> list[_Entry]:
        """Abandoned partial uploads (not claimed by a running upload). Call with the lock held."""
        entries = []
        for d in (self.root / "partial").iterdir():
            if d.name in self._claims or not d.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                entries.append(_Entry(d, sum(st.st_size for st in _files(d)), _last_activity(d)))
        return entries

    def _models(self) -> list[_Entry]:
        entries = []
        for d in (self.root / "models").iterdir():
            with contextlib.suppress(FileNotFoundError):
                entries.append(_Entry(d, sum(st.st_size for st in _files(d)), d.stat().st_mtime))
        return entries

    def _make_room(self, digest: str) -> None:
        """Evict abandoned partial uploads and unpinned models, least recently used first, until
        every claimed upload fits both the quota and the disk's free space."""
        with self._lock:
            partials, models = self._partials(), self._models()
            used = sum(e.size for e in partials + models) + sum(c.declared for c in self._claims.values())
            pending = sum(max(0, c.declared - c.on_disk) for c in self._claims.values())
            free = shutil.disk_usage(self.root).free
            evictable = partials + [m for m in models if self._pins[m.path.name] <= 0]
            for entry in sorted(evictable, key=lambda e: e.last_used):
                if used <= self.limits.quota_bytes and pending <= free:
                    break
                shutil.rmtree(entry.path, ignore_errors=True)
                used -= entry.size
                free += entry.size
                self.stats.evictions += entry.path.parent.name == "models"
                log.info(
                    "cache_evicted", path=f"{entry.path.parent.name}/{entry.path.name[:12]}", bytes=entry.size
                )
            if used > self.limits.quota_bytes:
                raise ResourceExhausted(
                    f"model cache is full: {used - self._claims[digest].declared} bytes held by models in use "
                    f"and uploads in progress, {self._claims[digest].declared} more needed, quota "
                    f"model_cache_quota_bytes={self.limits.quota_bytes} (daemon option --cache-quota)"
                )
            if pending > free:
                raise ResourceExhausted(
                    f"the disk holding the model cache has {free} bytes free, and uploads in progress need "
                    f"{pending}; free space on the board or lower the quota (daemon option --cache-quota)"
                )
