"""What every front end (the gRPC service, the legacy toolkit listener) does with models and sessions.

One object holds the backend, the model cache, the session registry and the executor; both protocols
go through it, so a session opened by either is the same kind of thing, counted against the same
limits, reaped by the same lease and freed the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from rknn_proto import rknn_pb2
from rknn_proto.manifest import FileEntry, manifest_digest
from rknn_server.errors import FailedPrecondition, ResourceExhausted
from rknn_server.model_cache import ModelCache
from rknn_server.runtime.base import Backend, ModelRuntime, RuntimeOptions, WorkerLost
from rknn_server.sessions import Session, SessionRegistry

log = structlog.get_logger("rknn_server.sessions")
T = TypeVar("T")
RuntimeOpener = Callable[[Backend, Any, RuntimeOptions], ModelRuntime]


@dataclass
class DataPlane:
    backend: Backend
    cache: ModelCache
    registry: SessionRegistry
    executor: ThreadPoolExecutor
    opener: RuntimeOpener

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def store_model(self, data: bytes, name: str) -> str:
        """Put a model received whole into the cache (as an upload would) and return its digest."""
        if len(data) > self.cache.limits.max_model_bytes:
            raise ResourceExhausted(
                f"the model is {len(data)} bytes; this daemon accepts at most max_model_bytes="
                f"{self.cache.limits.max_model_bytes}"
            )
        entry = FileEntry(name, len(data), hashlib.sha256(data).hexdigest())
        manifest = rknn_pb2.ModelManifest(
            digest=manifest_digest([entry]),
            files=[rknn_pb2.ModelFile(name=entry.name, size=entry.size, sha256=entry.sha256)],
        )
        cached, _ = self.cache.prepare(manifest)
        if not cached:
            upload = self.cache.begin_upload(manifest, [0])
            try:
                upload.write(0, 0, data)
                upload.finish()
            finally:
                upload.close()
        return manifest.digest

    async def open_session(self, digest: str, options: RuntimeOptions, owner: str) -> Session:
        """Load a cached model into a new session of `owner` (within the session limits)."""
        path = await self.blocking(self.cache.main_file, digest)
        self.registry.reserve(owner)
        self.cache.pin(digest)
        try:
            await self.blocking(self.cache.verify, digest)
            runtime = await self.blocking(self.opener, self.backend, path, options)
        except BaseException:
            self.registry.unreserve(owner)
            self.cache.unpin(digest)
            raise
        return self.registry.add(digest, options, runtime, owner)

    async def in_session(self, session: Session, fn: Callable[..., T], *args: Any) -> T:
        """Run one runtime call of a session, alone; a lost worker marks the session broken."""
        async with session.lock:
            if session.broken:
                raise FailedPrecondition(
                    f"session {session.id!r} is broken ({session.broken}); release it and call init_runtime again"
                )
            work = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                # The caller went away, but the runtime is still busy: keep the session locked (so that
                # the reaper cannot free a model mid-call) until the call really ends.
                await asyncio.wait([work])
                raise
            except WorkerLost as exc:
                session.broken = str(exc)
                log.warning("session_broken", session=session.id, reason=str(exc))
                raise
            finally:
                session.renew()

    async def release(self, session_id: str, owner: str, reason: str) -> None:
        """Close a session once no call runs in it."""
        session = self.registry.pop(session_id, owner)
        async with session.lock:
            await self.blocking(self.registry.close, session, reason)
