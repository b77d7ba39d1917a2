"""Content-addressed, on-disk model store with resumable uploads, a size quota and LRU eviction.

Layout under the root (created private, 0700):
    models/<digest>/<file name>     complete models, verified against their manifest
    partial/<digest>/<file name>    bytes of interrupted or running uploads, kept for resume
A model only appears under models/ by an atomic rename once every file's hash and the digest
verified, so a half-written model is never used. Bytes go to disk as they arrive (a file is created
by its first bytes, never from the header): nothing holds a whole model in memory.

Its parts, each in its own module: the manifest checked once per request (manifests.py), the room
(quota.py: one quota and the disk's free space over complete models, abandoned partial uploads and
the uploads in progress; least recently used first evicted, models pinned by live sessions never),
and what was last verified of each model (verification.py: the record beside its files, or what was
verified on arrival until the background sync makes it durable). Before a session opens a model its
files are checked against that; changed files are hashed again. `verify_due` re-hashes models on a
schedule and `verify_all` at start-up (--verify-cache): a model damaged on disk is removed and
reported instead of loaded. A full disk while writing discards that upload's bytes and fails with a
clear error.

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
from pathlib import Path

import structlog

from rknn_proto import rknn_pb2
from rknn_proto.manifest import valid_digest
from rknn_proto.reasons import Reason
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import Aborted, DataLoss, InvalidInput, NotFound
from rknn_server.store.cache_records import (
    MAIN_FILE_MARKER,
    FileStamp,
    Record,
    read_owners,
    stamp_of,
    write_owners,
)
from rknn_server.store.durability import sync_path
from rknn_server.store.manifests import CheckedManifest, validate_manifest
from rknn_server.store.quota import CacheStats, Quota
from rknn_server.store.uploads import UPLOADER_MARKER, Claim, Destination, Upload
from rknn_server.store.verification import Verifications

log = structlog.get_logger("rknn_server.cache")
# Damaged models remembered (digest -> when) so that a client asking for one hears why it is gone.
_DAMAGED_REMEMBERED = 256


class ModelCache:
    """The store's layout, tenancy and the steps of an upload; its room (`quota`: claims, pins,
    eviction) and what it last verified of each model (`verifications`) are its parts."""

    def __init__(self, root: Path, limits: CacheLimits) -> None:
        self.root = root
        self.limits = limits
        self.stats = CacheStats()
        self.quota = Quota(root, limits, self.stats)
        self.verifications = Verifications(root / "models")
        self._lock = threading.Lock()
        self._damaged: dict[str, tuple[str, ...]] = {}  # digest -> its owners, when removed as damaged
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)
        for sub in ("models", "partial", "staging"):
            (root / sub).mkdir(exist_ok=True, mode=0o700)
            os.chmod(root / sub, 0o700)
        shutil.rmtree(root / "staging", ignore_errors=True)
        (root / "staging").mkdir(mode=0o700)
        self._sweep()
        self.quota.expire_partials()

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
        self.quota.expire_partials()
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
        self.quota.claim(digest, claim)
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
            self.quota.make_room(digest)
            destination = Destination(
                self.partial_dir(digest),
                commit=lambda: self.commit(manifest, owner),
                release=lambda: self.quota.release(digest),
            )
            return Upload(destination, manifest, list(start_offsets), claim, owner)
        except BaseException:
            self.quota.release(digest)
            raise

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
            self.verifications.arrived(manifest.digest, Record(time.time(), tuple(stamps)))
        shutil.rmtree(partial, ignore_errors=True)
        with self._lock:
            self._damaged.pop(manifest.digest, None)
        self.touch(manifest.digest)
        with self._lock:
            self.stats.stored += 1
        return target / manifest.files[0].name

    def close(self) -> None:
        """Make durable the models committed so far (at a clean stop)."""
        self.verifications.close()

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
        """Check a cached model's files against its digest (verification.py); remove it (DATA_LOSS)
        if damaged."""
        try:
            if self.verifications.intact(digest, rehash):
                return
        except FileNotFoundError:
            raise self._not_cached(digest) from None
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
            record = self.verifications.last(digest)
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
