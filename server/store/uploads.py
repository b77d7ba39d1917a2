"""One running upload into the model cache: chunks gathered into large blocks, each hashed once and
written in one call while the next chunks arrive.

`receive` runs an upload's steps for a door (the UploadModel handler only parses and bounds its
chunks): the event loop only checks and gathers chunks (`accept`); a full block (`BLOCK_BYTES`) goes
to the executor (`store`), which queues the write of the received views themselves to the partial
file (one call, in the upload's write thread) and hashes those same views meanwhile (hashlib lets go
of the GIL for them), so that receiving, hashing and writing overlap instead of taking turns, and
every byte is hashed once and copied by nobody but the kernel. A file is created by its first bytes,
never from the header; resuming re-hashes the bytes already held; a full disk discards this upload's
bytes and says so.
The uploader (`owner`) becomes an owner of the model once every byte verified (model_cache.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import shutil
from collections.abc import AsyncIterable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rknn_proto import rknn_pb2
from rknn_server.errors import DataLoss, InvalidInput, ResourceExhausted
from rknn_server.store.block_writer import BlockWriter, WriteQueue

_HASH_READ_BYTES = 1 << 20
# Chunks are gathered into blocks this large before they are hashed and written: few large writes
# (whole pages, one system call per block) and one executor hop per block rather than per chunk.
BLOCK_BYTES = 4 << 20
# Names, in a partial upload's folder, the identity whose bytes it holds (only it may resume them).
UPLOADER_MARKER = ".uploader"
# A block is also stored once it holds this many chunks: a client sending tiny chunks must not pile
# up millions of objects.
BLOCK_PARTS = 1024


@dataclass
class Claim:
    """An upload in progress: the bytes it will hold once complete, and those already on disk."""

    declared: int
    on_disk: int = 0


@dataclass(frozen=True)
class Destination:
    """Where an upload goes, as the cache gave it: its partial folder, the commit of its verified
    bytes (the committed model's main file) and the release of its claim. The upload knows nothing
    else of the cache, and the cache calls it only to begin it."""

    folder: Path
    commit: Callable[[], Path]
    release: Callable[[], None]


@dataclass
class Block:
    """Accepted chunks not yet on disk, in order: (file index, bytes)."""

    parts: list[tuple[int, bytes | memoryview]] = field(default_factory=list)
    size: int = 0


class Upload:
    """One running upload: checks and gathers chunks, then hashes and appends them block by block.

    Each file is opened by its first chunk. Resuming re-hashes the bytes already held."""

    def __init__(
        self,
        destination: Destination,
        manifest: rknn_pb2.ModelManifest,
        start_offsets: list[int],
        claim: Claim,
        owner: str | None = None,
    ) -> None:
        self._destination = destination
        self._claim = claim
        self.manifest = manifest
        self.owner = owner
        self._dir = destination.folder
        self._hashers = []
        self._accepted = []  # bytes checked and taken per file, on disk or in the block
        for f, start in zip(manifest.files, start_offsets, strict=True):
            path = self._dir / f.name
            hasher = hashlib.sha256()
            if start:
                self._rehash(path, start, hasher, f.name)
            else:
                path.unlink(missing_ok=True)
            self._hashers.append(hasher)
            self._accepted.append(start)
        self._written = list(self._accepted)
        self._block = Block()
        self._writers: dict[int, BlockWriter] = {}  # files in progress only: a complete one is closed
        self._queue = WriteQueue()
        self._discarded = False  # the partial files are gone: nothing more is stored
        self._marked = False  # the folder names this upload's owner (done with the first bytes)
        self.received_bytes = 0

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

    def accept(self, file_index: int, offset: int, data: bytes | memoryview) -> Block | None:
        """Check a chunk and gather it; returns a full block for `store` (cheap: no disk, no hash)."""
        files = self.manifest.files
        if not 0 <= file_index < len(files):
            raise InvalidInput(f"chunk for file {file_index}; the manifest has {len(files)} file(s)")
        if offset != self._accepted[file_index]:
            raise InvalidInput(
                f"chunk of {files[file_index].name!r} at offset {offset}; expected offset {self._accepted[file_index]}"
            )
        end = offset + len(data)
        if end > files[file_index].size:
            raise InvalidInput(
                f"{files[file_index].name!r} received {end} bytes; the manifest declared {files[file_index].size}"
            )
        if not data:
            return None
        self._accepted[file_index] = end
        self.received_bytes += len(data)
        self._block.parts.append((file_index, data))
        self._block.size += len(data)
        full = self._block.size >= BLOCK_BYTES or len(self._block.parts) >= BLOCK_PARTS
        return self.take() if full else None

    def adopt(self, path: Path) -> None:
        """Take a whole one-file model received elsewhere as this upload's bytes: moved into place,
        not copied, and hashed again (`finish` then verifies and commits it)."""
        (f,) = self.manifest.files
        if self._accepted[0] or self._block.size:
            raise InvalidInput(f"{f.name!r} already has bytes in this upload; a whole file is adopted alone")
        target = self._dir / f.name
        with self._disk_errors():
            self._open_dir()
            os.replace(path, target)
            self._rehash(target, f.size, self._hashers[0], f.name)
        self._accepted[0] = self._written[0] = f.size
        self._claim.on_disk += f.size

    def take(self) -> Block:
        """The chunks gathered so far, handed over for `store`."""
        block, self._block = self._block, Block()
        return block

    def store(self, block: Block) -> None:
        """Queue a block's writes to its partial files (one system call per file it touches) and hash
        it while they run."""
        if self._discarded:
            return
        with self._disk_errors():
            i = 0
            while i < len(block.parts):
                file_index = block.parts[i][0]
                run = []
                while i < len(block.parts) and block.parts[i][0] == file_index:
                    run.append(block.parts[i][1])
                    i += 1
                self._writer(file_index).write(run)
                hasher = self._hashers[file_index]
                for data in run:
                    hasher.update(data)
                size = sum(len(d) for d in run)
                self._written[file_index] += size
                self._claim.on_disk += size
                if self._written[file_index] == self.manifest.files[file_index].size:
                    self._writers.pop(file_index).close()

    @contextlib.contextmanager
    def _disk_errors(self) -> Iterator[None]:
        """A failed write discards the upload: what reached the disk may no longer match the hash, so
        it is never resumed from. A full disk says so."""
        try:
            yield
        except OSError as exc:
            self._discard()
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise ResourceExhausted(
                f"the disk holding the model cache is full ({exc.strerror}); this upload's partial bytes "
                "were discarded: free space on the board or lower the quota (--cache-quota), then upload again"
            ) from None

    def _writer(self, file_index: int) -> BlockWriter:
        writer = self._writers.get(file_index)
        if writer is None:
            self._open_dir()
            path = self._dir / self.manifest.files[file_index].name
            writer = self._writers[file_index] = BlockWriter(path, self._written[file_index], self._queue)
        return writer

    def _open_dir(self) -> None:
        """Make the partial folder for bytes about to land, naming whose they are."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._marked:
            (self._dir / UPLOADER_MARKER).write_text(self.owner or "")
            self._marked = True

    def write(self, file_index: int, offset: int, data: bytes) -> None:
        """`accept` and, once a block is full, `store`: the whole path in the calling thread."""
        block = self.accept(file_index, offset, data)
        if block is not None:
            self.store(block)

    def finish(self) -> Path:
        """Store what is gathered, verify every file and move the model into the store; returns its
        main file."""
        self.store(self.take())
        with self._disk_errors():
            self._close_handles(raise_errors=True)
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
        return self._destination.commit()

    def _discard(self) -> None:
        self._discarded = True
        self._close_handles()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._claim.on_disk = 0

    def _close_handles(self, raise_errors: bool = False) -> None:
        """Close the files in progress once their writes are done; a write error is raised only
        with `raise_errors` (otherwise the upload is ending anyway)."""
        writers = list(self._writers.values())
        self._writers.clear()
        try:
            if raise_errors:
                self._queue.drain()
        finally:
            for writer in writers:
                with contextlib.suppress(OSError):
                    writer.close()
            self._queue.close()

    def close(self) -> None:
        """End the upload (whatever happened) and release its claim on the model; the chunks
        gathered but not yet stored are kept for resume, as far as the disk allows."""
        with contextlib.suppress(OSError, ResourceExhausted):
            self.store(self.take())
        self._close_handles()
        self._destination.release()


# One chunk of a model's bytes as a door received it: (file index, offset, data).
Part = tuple[int, int, bytes | memoryview]


async def receive(begin: Callable[[], Upload], executor: Executor, parts: AsyncIterable[Part]) -> Upload:
    """A whole upload: `begin` (claim the model) in the executor, then `parts` gathered on the event
    loop while the executor hashes and writes the block before, then the verified commit; returns
    the upload, ended. Its claim dies with the call whatever point a cancellation hits: a step still
    running in the executor when the call ends releases it once it is done."""
    loop = asyncio.get_running_loop()
    step: asyncio.Future[Any] = loop.run_in_executor(executor, begin)
    try:
        upload: Upload = await asyncio.shield(step)
    except BaseException:
        step.add_done_callback(_close_claimed)
        raise
    try:
        async for file_index, offset, data in parts:
            block = upload.accept(file_index, offset, data)
            if block is not None:
                await asyncio.shield(step)
                step = loop.run_in_executor(executor, upload.store, block)
        await asyncio.shield(step)
        step = loop.run_in_executor(executor, upload.finish)
        await asyncio.shield(step)
    finally:
        if step.done():
            upload.close()
        else:
            step.add_done_callback(lambda _: upload.close())
    return upload


def _close_claimed(step: asyncio.Future[Upload]) -> None:
    """Release an upload claimed by a call that ended before it could take it."""
    if not step.cancelled() and step.exception() is None:
        step.result().close()
