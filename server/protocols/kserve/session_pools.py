"""The sessions v2 requests run in: a small pool per (model digest, caller), bounded in all.

v2 has no sessions of its own: every request names a model. Each caller gets sessions of a model on
first use, kept for the requests after; a session runs one call at a time, so a caller's concurrent
requests (8 perf_analyzer clients of one user, a web server's workers) would queue on one. A pool
holds up to `parallel` sessions (V2Models: twice the runtime's `parallel_runs`, the runs that compute
side by side and one waiting at the runtime's gate for each; sessions of a model share its runtime),
opened only when every one it has is busy and only while the daemon's session limits and memory
budget allow; past that, requests queue on the least busy of the pool's sessions. Beyond `capacity`
sessions in all, the least recently used pool gives its sessions back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from rknn_server.core.data_plane import DataPlane, OpenRequest
from rknn_server.core.sessions import Session
from rknn_server.errors import ResourceExhausted, ServiceError

Key = tuple[str, str]  # (model digest, caller)


@dataclass
class _Opening:
    """The lock a pool's opens take turns on, and the requests holding or awaiting it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class SessionPools:
    """Pools of sessions by (model digest, caller), the least recently used closed beyond `capacity`."""

    def __init__(self, plane: DataPlane, capacity: int, parallel: int = 1) -> None:
        self.plane = plane
        self.capacity = max(1, capacity)
        self.parallel = max(1, parallel)
        self._pools: OrderedDict[Key, list[str]] = OrderedDict()
        self._opening: dict[Key, _Opening] = {}
        self._turn = itertools.count()

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._pools.values())

    def _live(self, key: Key) -> list[Session]:
        """The pool's sessions still open (the idle reaper may have closed some), most recent use last."""
        ids = self._pools.get(key)
        if ids is None:
            return []
        alive = []
        for session_id in list(ids):
            try:
                alive.append(self.plane.session(session_id, key[1], usable=False))
            except ServiceError:  # closed by the reaper
                ids.remove(session_id)
        if ids:
            self._pools.move_to_end(key)
        else:
            del self._pools[key]
        return alive

    def _pick(self, key: Key) -> Session | None:
        """An idle healthy session of the pool; else, once the pool is full, one in turn to queue on."""
        healthy = [s for s in self._live(key) if not s.broken]
        idle = next((s for s in healthy if not s.lock.locked()), None)
        if idle is not None or len(healthy) < self.parallel:
            return idle
        return self._in_turn(healthy)

    def _in_turn(self, sessions: list[Session]) -> Session:
        """The full pool's busy session with the fewest calls queued on it (the first of them from a
        turning start): a request queued behind a long queue while another session has none would
        leave a core idle."""
        start = next(self._turn) % len(sessions)
        turned = sessions[start:] + sessions[:start]
        return min(turned, key=lambda s: s.waiting + s.lock.locked())

    async def get(self, digest: str, owner: str, shared: bool) -> tuple[Session, bool]:
        """A session of the caller's pool of the model (`shared`: by a repository name) for one
        request, and whether it was opened now."""
        key = (digest, owner)
        session = self._pick(key)
        if session is not None:
            return session, False
        opening = self._opening.setdefault(key, _Opening())
        opening.users += 1
        try:
            async with opening.lock:
                session = self._pick(key)
                if session is not None:
                    return session, False
                for broken in [s for s in self._live(key) if s.broken]:
                    await self._close(key, broken.id)
                mine = [s for s in self._live(key) if not s.broken]
                while len(self) >= self.capacity:
                    others = [k for k in self._pools if k != key]
                    if not others:  # every session is this pool's own, all busy: queue on one
                        return self._in_turn(mine), False
                    await self._close_pool(others[0])  # the least recently used pool
                try:
                    session = await self.plane.open(OpenRequest(digest=digest, owner=owner, shared=shared))
                except ResourceExhausted:
                    if not mine:
                        raise
                    return self._in_turn(mine), False  # limits reached: queue instead
                self._pools.setdefault(key, []).append(session.id)
                self._pools.move_to_end(key)
                return session, True
        finally:
            # Dropped only when no request holds or awaits it: a lock just released still has its
            # woken waiter to come, and a new lock beside it would let two opens pass at once.
            opening.users -= 1
            if not opening.users:
                self._opening.pop(key, None)

    async def _close(self, key: Key, session_id: str) -> None:
        ids = self._pools.get(key, [])
        if session_id in ids:
            ids.remove(session_id)
        if not ids:
            self._pools.pop(key, None)
        with contextlib.suppress(ServiceError):  # already closed by the reaper
            await self.plane.close(session_id, key[1])

    async def _close_pool(self, key: Key) -> None:
        for session_id in list(self._pools.get(key, [])):
            await self._close(key, session_id)

    async def drop(self, digest: str, owner: str | None = None) -> int:
        """Close the pooled sessions of a model (`owner`'s only, if named); how many there were."""
        keys = [key for key in self._pools if key[0] == digest and owner in (None, key[1])]
        closed = sum(len(self._pools[key]) for key in keys)
        for key in keys:
            await self._close_pool(key)
        return closed


__all__ = ["SessionPools"]
