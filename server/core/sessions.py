"""Open sessions, each a model loaded into a runtime, with an idle lease.

A session whose client stops calling (crash, cable pulled) is released by the reaper after the
idle timeout, freeing its runtime memory and unpinning its model: nothing needs a daemon restart.
Calls into one session are serialised by its lock (the event loop's callers queue on it) and run
under its compute lock (a thread's: the doorbells' threads ring frames without the event loop);
different sessions run in parallel.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from rknn_proto.buffers import BufferPool
from rknn_proto.reasons import Reason
from rknn_server.errors import FailedPrecondition, NotFound, ResourceExhausted
from rknn_server.runtime.base import ModelRuntime, RuntimeOptions

if TYPE_CHECKING:
    from rknn_server.core.frames import CheckedInputs

log = structlog.get_logger("rknn_server.sessions")


@dataclass
class Session:
    id: str
    digest: str
    options: RuntimeOptions
    runtime: ModelRuntime
    idle_timeout_s: float
    owner: str = ""
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Held by whichever thread runs the runtime: an executor job or a doorbell's thread.
    compute: threading.Lock = field(default_factory=threading.Lock)
    # Why the session can no longer run (its worker was killed); empty while it is healthy.
    broken: str = ""
    # Set (under `compute`) once its runtime is freed: a doorbell holding the session stops there.
    closed: bool = False
    # Its frames' input buffers, used again once a frame is done with them (rknn_proto.buffers).
    buffers: BufferPool = field(default_factory=BufferPool)
    # Whether its last timed run was quick enough to run the next on the event loop (data_plane.py).
    quick: bool = False
    # Calls waiting for its lock: where a pool of sessions queues the next one (kserve/session_pools.py).
    waiting: int = 0
    # The model repository's own session of a READY model (kserve/models.py): it keeps the model
    # loaded between callers, so it has no idle lease and no place under the clients' session limits.
    resident: bool = False
    # Its last frame's inputs as the intake passed them, for the next frame like it (frames.py).
    checked_inputs: CheckedInputs | None = None

    def renew(self) -> None:
        self.last_used = time.monotonic()

    def expires_in(self) -> float:
        return max(0.0, self.idle_timeout_s - (time.monotonic() - self.last_used))


class SessionRegistry:
    def __init__(
        self,
        max_sessions: int,
        idle_timeout_s: float,
        max_per_client: int = 0,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client or max_sessions
        self.idle_timeout_s = idle_timeout_s
        self._sessions: dict[str, Session] = {}
        self._reserved: Counter[str] = Counter()

    def __len__(self) -> int:
        """The clients' open sessions, as the limits count them (residents are the repository's)."""
        return sum(not s.resident for s in self._sessions.values())

    def reserve(self, owner: str) -> None:
        """Claim a slot before loading a model, so concurrent loads cannot exceed the limits."""
        held = sum(1 for s in self._sessions.values() if s.owner == owner) + self._reserved[owner]
        if len(self) + self._reserved.total() >= self.max_sessions:
            raise ResourceExhausted(
                f"the daemon already has {len(self)} open session(s), the limit max_sessions="
                f"{self.max_sessions}; release one (or wait {self.idle_timeout_s:.0f}s for idle ones to expire)"
            )
        if held >= self.max_per_client:
            raise ResourceExhausted(
                f"client {owner!r} already holds {held} session(s), the limit max_sessions_per_client="
                f"{self.max_per_client}; release one first"
            )
        self._reserved[owner] += 1

    def unreserve(self, owner: str) -> None:
        self._reserved[owner] -= 1
        if self._reserved[owner] <= 0:
            del self._reserved[owner]

    def add(
        self, digest: str, options: RuntimeOptions, runtime: ModelRuntime, owner: str, resident: bool = False
    ) -> Session:
        """A session opened in the slot `owner` reserved; a resident one took none."""
        if not resident:
            self.unreserve(owner)
        session = Session(
            secrets.token_hex(16), digest, options, runtime, self.idle_timeout_s, owner, resident=resident
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, owner: str, usable: bool = True) -> Session:
        """The caller's session (another client's session id is as unknown as a wrong one)."""
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            raise NotFound(
                f"session {session_id!r} does not exist: it was released, expired after "
                f"{self.idle_timeout_s:.0f}s without calls, or the daemon restarted; call init_runtime again",
                reason=Reason.SESSION_NOT_FOUND,
            )
        session.renew()
        if usable and session.broken:
            raise FailedPrecondition(
                f"session {session_id!r} is broken ({session.broken}); release it and call init_runtime again",
                reason=Reason.SESSION_BROKEN,
            )
        return session

    def pop(self, session_id: str, owner: str) -> Session:
        session = self.get(session_id, owner, usable=False)
        del self._sessions[session_id]
        return session

    def expired(self) -> list[Session]:
        """Remove and return the sessions whose lease ran out (and that are not busy: no call waiting or
        running, no doorbell frame running)."""
        now = time.monotonic()
        gone = [
            s
            for s in self._sessions.values()
            if not s.resident
            and now - s.last_used > s.idle_timeout_s
            and not s.lock.locked()
            and not s.compute.locked()
        ]
        for s in gone:
            del self._sessions[s.id]
        return gone

    def drain(self) -> list[Session]:
        gone = list(self._sessions.values())
        self._sessions.clear()
        return gone

    def close(self, session: Session, reason: str) -> None:
        """Free a session's runtime (the data plane unpins its model); never raises (a failing close
        must not hurt other sessions). A frame in flight on a doorbell's thread ends first."""
        with session.compute:
            session.closed = True
            try:
                session.runtime.close()
            except Exception as exc:
                log.warning("session_close_failed", session=session.id, error=str(exc))
        log.info("session_released", session=session.id, reason=reason, model=session.digest[:12])
