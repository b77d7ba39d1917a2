"""A toolkit model (the body of a MsgLoad) taken in without holding it in memory.

The toolkit sends a whole .rknn in one message, up to the 4 GiB a u32 length allows. Its declared size
is checked against the limits first (--max-model-bytes, --max-session-memory, the cache's quota, less
what other loads are spooling), before a byte of the body is read; the body then goes, block by block,
through one budget-held buffer into a file in the cache's staging folder (emptied at every start),
hashed on the way, and the cache adopts the file as the caller's upload of it (moved, verified, committed).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from rknn_proto import rknn_pb2
from rknn_proto.manifest import FileEntry, manifest_digest
from rknn_server.core.data_plane import DataPlane
from rknn_server.errors import ResourceExhausted

MODEL_NAME = "model.rknn"
BLOCK_BYTES = 1 << 20  # held in memory per load in progress
Read = Callable[[int], Awaitable[bytes]]  # up to N bytes of the connection (fewer, never none)


class ModelIntake:
    """The listener's model intake: the checks by declared size, the spooling and the import."""

    def __init__(self, plane: DataPlane, max_model_bytes: int) -> None:
        self.plane = plane
        self.max_model_bytes = max_model_bytes
        self.spooling = 0  # bytes declared by the loads being spooled now

    def check(self, size: int) -> None:
        """Refuse a model by its declared size, naming the limit, before its body is read."""
        session_memory = self.plane.memory.max_session_memory
        quota = self.plane.cache.limits.quota_bytes
        if size > self.max_model_bytes:
            raise ResourceExhausted(
                f"the model is {size} bytes; the limit is max_model_bytes={self.max_model_bytes} (--max-model-bytes)"
            )
        if session_memory and size > session_memory:
            raise ResourceExhausted(
                f"the model is {size} bytes, more than one session may hold in memory, "
                f"max_session_memory_bytes={session_memory} (--max-session-memory)"
            )
        if self.spooling + size > quota:
            raise ResourceExhausted(
                f"the model is {size} bytes and other toolkit loads are receiving {self.spooling}; the model "
                f"cache holds at most model_cache_quota_bytes={quota} (--cache-quota): retry later"
            )

    async def receive(self, read: Read, size: int, trailing: int, owner: str) -> str:
        """Stream a checked model of `size` bytes (then `trailing` bytes, dropped) into the cache as
        `owner`'s upload (who sent every byte, so it may use the model); returns its digest."""
        self.check(size)
        self.spooling += size
        spool = self.plane.cache.root / "staging" / f"toolkit-{uuid.uuid4().hex}.rknn"
        try:
            sha256 = await self._spool(read, size, spool)
            await _skip(read, trailing)
            manifest = _manifest(size, sha256)
            await self.plane.blocking(self.plane.cache.adopt, manifest, spool, owner)
            return manifest.digest
        finally:
            self.spooling -= size
            spool.unlink(missing_ok=True)

    async def _spool(self, read: Read, size: int, spool: Path) -> str:
        """Write `size` bytes of the connection to `spool` through one held block; returns their sha256."""
        buffer = np.empty(min(size, BLOCK_BYTES), np.uint8)
        self.plane.frame_memory.hold([buffer], "a toolkit model being received")
        block = buffer.data.cast("B")
        hasher = hashlib.sha256()
        fd = await self.plane.blocking(os.open, spool, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = size
            while left:
                filled = 0
                while filled < min(len(block), left):
                    data = await read(min(len(block), left) - filled)
                    block[filled : filled + len(data)] = data
                    filled += len(data)
                await self.plane.blocking(_write, fd, block[:filled], hasher)
                left -= filled
        finally:
            os.close(fd)
        return hasher.hexdigest()


async def _skip(read: Read, count: int) -> None:
    while count:
        count -= len(await read(min(count, BLOCK_BYTES)))


def _write(fd: int, data: memoryview, hasher: hashlib._Hash) -> None:
    """In the executor: hash and append one block (hashlib lets go of the GIL)."""
    hasher.update(data)
    while data:
        data = data[os.write(fd, data) :]


def _manifest(size: int, sha256: str) -> rknn_pb2.ModelManifest:
    entry = FileEntry(MODEL_NAME, size, sha256)
    return rknn_pb2.ModelManifest(
        digest=manifest_digest([entry]),
        files=[rknn_pb2.ModelFile(name=entry.name, size=entry.size, sha256=entry.sha256)],
    )
