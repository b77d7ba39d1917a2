"""One running upload into the model cache: chunks appended to the partial files, hashed as they arrive.

A file is created by its first bytes, never from the header; resuming re-hashes the bytes already
held; a full disk discards this upload's bytes and says so.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from rknn_proto import rknn_pb2
from rknn_server.errors import DataLoss, InvalidInput, ResourceExhausted

if TYPE_CHECKING:
    from rknn_server.model_cache import ModelCache

_HASH_READ_BYTES = 1 << 20


@dataclass
class Claim:
    """An upload in progress: the bytes it will hold once complete, and those already on disk."""

    declared: int
    on_disk: int = 0


class Upload:
    """One running upload: appends chunks to the partial files, hashing as it goes.

    Each file is opened by its first chunk. Resuming re-hashes the bytes already held."""

    def __init__(
        self, cache: ModelCache, manifest: rknn_pb2.ModelManifest, start_offsets: list[int], claim: Claim
    ) -> None:
        self._cache = cache
        self._claim = claim
        self.manifest = manifest
        self._dir = cache.partial_dir(manifest.digest)
        self._hashers = []
        self._written = []
        self.received_bytes = 0
        for f, start in zip(manifest.files, start_offsets, strict=True):
            path = self._dir / f.name
            hasher = hashlib.sha256()
            if start:
                self._rehash(path, start, hasher, f.name)
            else:
                path.unlink(missing_ok=True)
            self._hashers.append(hasher)
            self._written.append(start)
        self._handles: dict[int, BinaryIO] = {}

    @staticmethod
    def _rehash(path: Path, start: int, hasher: hashlib._Hash, name: str) -> None:
        """Hash the first `start` bytes held of a file, dropping anything past them."""
        with path.open("r+b") as fh:
            fh.truncate(start)
            remaining = start
            while remaining:
                block = fh.read(min(_HASH_READ_BYTES, remaining))
                if not block:
                    raise DataLoss(f"partial upload of {name!r} is shorter than {start} bytes; upload again")
                hasher.update(block)
                remaining -= len(block)

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
        if not data:
            return
        try:
            handle = self._handles.get(file_index)
            if handle is None:
                self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                handle = self._handles[file_index] = (self._dir / files[file_index].name).open("ab")
            handle.write(data)
            handle.flush()
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self._discard()
            raise ResourceExhausted(
                f"the disk holding the model cache is full ({exc.strerror}); this upload's partial bytes "
                "were discarded: free space on the board or lower the quota (--cache-quota), then upload again"
            ) from None
        self._hashers[file_index].update(data)
        self._written[file_index] = end
        self._claim.on_disk += len(data)
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
                self._discard()
                raise DataLoss(
                    f"bytes of {f.name!r} hash to {actual}, not the declared sha256 {f.sha256}; "
                    "the partial upload was discarded"
                )
        return self._cache.commit(self.manifest)

    def _discard(self) -> None:
        self._close_handles()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._claim.on_disk = 0

    def _close_handles(self) -> None:
        handles = list(self._handles.values())
        self._handles.clear()
        for handle in handles:
            try:
                handle.close()
            except OSError:
                continue

    def close(self) -> None:
        """End the upload (whatever happened) and release its claim on the model."""
        self._close_handles()
        self._cache.end_upload(self.manifest.digest)
