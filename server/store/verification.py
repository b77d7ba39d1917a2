"""One place for what the store last verified of each model, and the check of a model's files
against it.

A model's verification record is kept beside its files (cache_records.py) once they are durable. A
model just committed is synced to the disk in the background (durability.py); until then the stamps
taken as it verified on arrival stand in for its record, in memory, and its record is written only
after the sync, so a power cut before it means hashing again on the next open, never trusting bytes
the disk may not hold. Everything that asks what was verified (an open's check, the re-verification
schedule) asks `last`, which answers from either.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path

import structlog

from rknn_proto.manifest import FileEntry, file_sha256, manifest_digest
from rknn_server.store.cache_records import (
    MAIN_FILE_MARKER,
    OWNERS_FILE,
    FileStamp,
    Record,
    read_record,
    stamp_of,
    write_record,
)
from rknn_server.store.durability import Syncer, sync_path

log = structlog.get_logger("rknn_server.cache")


class Verifications:
    """The verification records of the models under one folder (models/<digest>/)."""

    def __init__(self, models: Path) -> None:
        self._models = models
        self._lock = threading.Lock()
        self._arrived: dict[str, Record] = {}  # committed, not yet durable: what was verified on arrival
        self._syncer = Syncer()

    def arrived(self, digest: str, record: Record) -> None:
        """A model committed with the stamps verified as it arrived: remembered until it is durable,
        then its record is written (by the syncer)."""
        with self._lock:
            self._arrived[digest] = record
        self._syncer.submit(lambda: self._make_durable(digest, record))

    def last(self, digest: str) -> Record | None:
        """What was last verified of a model: its record, else what it verified on arrival and has
        not yet made durable."""
        record = read_record(self._models / digest)
        if record is None:
            with self._lock:
                record = self._arrived.get(digest)
        return record

    def intact(self, digest: str, rehash: bool = False) -> bool:
        """Whether a model's files hash to its digest. Files unchanged since their last verification
        (same size, mtime and inode) are trusted unless `rehash`; files hashed and intact get a new
        record. FileNotFoundError: the model's folder is gone."""
        folder = self._models / digest
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
            record = self.last(digest)
            if not rehash and record is not None and record.describes(stamps):
                remembered = [FileEntry(f.name, f.size, f.sha256) for f in record.files]
                if manifest_digest(remembered) == digest:
                    return True
            started = time.monotonic()
            hashes = [file_sha256(p) for p in paths]
        except OSError:
            if not folder.exists():
                raise FileNotFoundError(folder) from None
            return False
        entries = [FileEntry(name, size, h) for (name, size, _, _), h in zip(stamps, hashes, strict=True)]
        intact = manifest_digest(entries) == digest
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
        return intact

    def close(self) -> None:
        """Make durable the models committed so far (at a clean stop)."""
        self._syncer.close()

    def _make_durable(self, digest: str, record: Record) -> None:
        """In the syncer: sync a committed model's files, marker and folders, then write its record.
        A model evicted meanwhile is left alone; one that cannot be synced is removed (its bytes on
        the disk are not known to be the ones verified)."""
        folder = self._models / digest
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
