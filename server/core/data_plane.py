"""The data plane: sessions, the model cache and the executor, in plain Python terms.

Every inference protocol the daemon speaks (the gRPC service in service.py, a legacy listener) turns
its wire messages into calls here and the results back into its own messages; nothing here knows a
protocol. It opens a session (reserve a slot, pin the model, verify it, load it, undo all of that on
failure), runs calls in a session (alone, in the executor, timed for the metrics), and closes
sessions (release the runtime, unpin the model) for a client, the idle reaper or shutdown.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import structlog

from rknn_proto import codec
from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse, LayerDump
from rknn_proto.reasons import Reason
from rknn_server.config.limits import MemoryLimits, SessionLimits
from rknn_server.core.memory import MemoryBudget
from rknn_server.core.sessions import Session, SessionRegistry
from rknn_server.errors import FailedPrecondition, InvalidInput, NotFound
from rknn_server.observe.metrics import DaemonMetrics
from rknn_server.runtime.base import (
    Backend,
    InputFormat,
    ModelRuntime,
    RuntimeOptions,
    VersionInfo,
    WorkerLost,
)
from rknn_server.store.model_cache import ModelCache

log = structlog.get_logger("rknn_server.data_plane")
T = TypeVar("T")
# A timed run of a steady runtime (ModelRuntime.steady) whose last run computed in less than this runs
# on the event loop, as KServe's server runs every call: the executor's hand-off (a thread wake-up each
# way) cost more than such a run (a tiny model, over rknn.v1: ~0.1 ms of the daemon's CPU per call).
INLINE_RUN_S = 0.0005


@dataclass(frozen=True)
class OpenRequest:
    """What a client asks for when it opens a session (protocol-neutral)."""

    digest: str
    owner: str  # the caller: the model must be one of its own (uploaded by it) unless `shared`
    reservation: str | None = None  # the caller's reservation token, if it holds the board
    target: str = ""
    perf_debug: bool = False
    eval_mem: bool = False
    core_mask: int = 0
    fallback_prior_device: str = "cpu"
    shared: bool = False  # a model the caller reaches by a shared name (the model repository's)
    resident: bool = False  # the repository's own session of a READY model (sessions.Session.resident)


@dataclass
class RunTimes:
    """A timed run's wait for its session (its lock, then the executor) and its runtime call, in ns:
    the intervals the metrics observed, so that a protocol's own statistics (KServe v2's) report the
    same ones."""

    queue_ns: int = 0
    compute_ns: int = 0


@dataclass(frozen=True)
class Ran:
    """A frame's outputs and the time the run took (queueing for the session included)."""

    outputs: list[np.ndarray]
    run_time_us: int
    times: RunTimes


@dataclass
class DataPlane:
    backend: Backend
    cache: ModelCache
    executor: ThreadPoolExecutor
    metrics: DaemonMetrics
    tensor_limits: codec.TensorLimits
    sessions: SessionLimits = field(default_factory=SessionLimits)
    memory: MemoryLimits = field(default_factory=MemoryLimits)
    # Raises when a reservation of the board by someone else keeps this caller out (reservations.py).
    admit: Callable[[str | None], None] = lambda reservation: None
    # Told the id of every session that closes, whatever closed it (shared-memory regions go with it).
    on_close: list[Callable[[str], None]] = field(default_factory=list)
    registry: SessionRegistry = field(init=False)
    frame_memory: MemoryBudget = field(init=False)
    # A gated backend's model runs (Backend.gated_runs) on threads of their own, as many as may
    # compute at once. From the shared executor, every run beyond those parked a thread on the
    # backend's gate, and the runs moved from thread to thread: MobileNetV2 at 8 callers on 2 cores
    # took 10% more CPU a request and 14% longer (p50) than in a queue before two threads.
    runs: ThreadPoolExecutor | None = field(init=False, default=None)
    # Runtime calls computing now on other threads (executor jobs, doorbells): a run on the event loop
    # would wait for the runtime's gate behind them.
    _elsewhere: int = field(init=False, default=0)
    _elsewhere_lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.registry = SessionRegistry(
            self.sessions.max_sessions, self.sessions.idle_timeout_s, self.sessions.max_per_client
        )
        self.frame_memory = MemoryBudget(self.memory.max_memory)
        if self.backend.gated_runs:
            self.runs = ThreadPoolExecutor(self.backend.parallel_runs, thread_name_prefix="run")

    def shutdown(self) -> None:
        """Stop the threads; what is queued on them is cancelled."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.runs is not None:
            self.runs.shutdown(wait=False, cancel_futures=True)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work (file IO, a runtime call outside any session) in the executor."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # -- Opening and closing -----------------------------------------------------------------

    def check_target(self, target: str) -> None:
        soc = self.backend.soc()
        if soc and target and target.lower() != soc:
            raise FailedPrecondition(
                f"target mismatch: the model is meant for {target.lower()}, but this daemon's board is {soc}",
                hints={"board_soc": soc, "target": target.lower()},
                reason=Reason.TARGET_MISMATCH,
            )

    async def open(self, request: OpenRequest) -> Session:
        """Load a cached model into a new session of `request.owner`; on any failure nothing is held.
        A model the caller may not use is NOT_FOUND, as one that is not cached."""
        self.admit(request.reservation)
        self.check_target(request.target)
        if request.fallback_prior_device not in ("cpu", "gpu"):
            raise InvalidInput(
                f"fallback_prior_device {request.fallback_prior_device!r} is not allowed; expected 'cpu' or 'gpu'"
            )
        path = await self.blocking(
            self.cache.main_file, request.digest, None if request.shared else request.owner
        )
        options = RuntimeOptions(
            target=request.target.lower(),
            perf_debug=request.perf_debug,
            eval_mem=request.eval_mem,
            core_mask=request.core_mask,
            fallback_prior_device=request.fallback_prior_device,
            max_memory_bytes=self.memory.max_session_memory,
        )
        if not request.resident:
            self.registry.reserve(request.owner)
        self.cache.quota.pin(request.digest)
        try:
            await self.blocking(self.cache.verify, request.digest)
            runtime = await self.blocking(self.backend.open, path, options)
        except BaseException:
            if not request.resident:
                self.registry.unreserve(request.owner)
            self.cache.quota.unpin(request.digest)
            raise
        return self.registry.add(request.digest, options, runtime, request.owner, request.resident)

    def session(self, session_id: str, owner: str, usable: bool = True) -> Session:
        """The owner's session (another client's is as unknown as a wrong id); renews its lease."""
        return self.registry.get(session_id, owner, usable)

    async def close(self, session_id: str, owner: str) -> Session:
        """Release the owner's session once its call in flight (if any) ends."""
        session = self.registry.pop(session_id, owner)
        async with session.lock:
            await self.blocking(self._close, session, "released by client")
        return session

    async def reap(self) -> None:
        """Close the sessions whose idle lease ran out."""
        for session in self.registry.expired():
            await self.blocking(self._close, session, "idle lease expired")

    def close_all(self, reason: str) -> None:
        for session in self.registry.drain():
            self._close(session, reason)

    def _close(self, session: Session, reason: str) -> None:
        try:
            self.registry.close(session, reason)
        finally:
            self.cache.quota.unpin(session.digest)
            for listener in self.on_close:
                listener(session.id)

    # -- Calls in a session ------------------------------------------------------------------

    async def in_session(
        self, session: Session, fn: Callable[..., T], *args: Any, timed: RunTimes | None = None
    ) -> T:
        """Run one runtime call of a session, alone, in the executor (DataPlane.alone).

        `timed` calls (model runs) count the wait for the session's lock (and for a run thread) as
        queueing and the runtime call as compute, per model, and are told both; they run on the run
        threads where the backend has them. A quick run of a steady runtime runs here, on the event
        loop, when nothing would make it wait (INLINE_RUN_S)."""
        queued = time.perf_counter()
        if timed is not None and self._quick_and_free(session) and session.compute.acquire(blocking=False):
            try:
                return self._compute(session, queued, timed, fn, *args)
            finally:
                session.compute.release()
        session.waiting += 1
        try:
            await session.lock.acquire()
        finally:
            session.waiting -= 1
        try:
            threads = self.runs if timed is not None and self.runs is not None else self.executor
            work = asyncio.get_running_loop().run_in_executor(
                threads, self.alone, session, queued, timed, fn, *args
            )
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                # The caller went away, but the runtime is still busy: keep the session locked (so that
                # the reaper cannot free a model mid-call) until the call really ends.
                await asyncio.wait([work])
                raise
        finally:
            session.lock.release()

    def alone(
        self, session: Session, queued: float, timed: RunTimes | None, fn: Callable[..., T], *args: Any
    ) -> T:
        """One runtime call of a session on this thread, under its compute lock: an executor job of
        `in_session`, or a doorbell's frame (server/protocols/local/doorbell.py). A closed session does not run, and a
        lost worker marks the session broken."""
        with session.compute, self._counted():
            return self._compute(session, queued, timed, fn, *args)

    def _quick_and_free(self, session: Session) -> bool:
        """Whether a run of this session would be quick and wait for nothing: its last run was quick,
        its runtime steady, no call of it queued and no other runtime call computing."""
        return session.quick and session.runtime.steady and not session.lock.locked() and not self._elsewhere

    @contextmanager
    def _counted(self) -> Iterator[None]:
        """Counts the calls computing on other threads than the event loop's."""
        with self._elsewhere_lock:
            self._elsewhere += 1
        try:
            yield
        finally:
            with self._elsewhere_lock:
                self._elsewhere -= 1

    def _compute(
        self, session: Session, queued: float, timed: RunTimes | None, fn: Callable[..., T], *args: Any
    ) -> T:
        """The runtime call itself, its session's compute lock held by the caller."""
        started = time.perf_counter()
        if session.closed:
            raise NotFound(
                f"session {session.id!r} was closed (released, or idle for its lease); call init_runtime again",
                reason=Reason.SESSION_NOT_FOUND,
            )
        if session.broken:
            raise FailedPrecondition(
                f"session {session.id!r} is broken ({session.broken}); release it and call init_runtime again",
                reason=Reason.SESSION_BROKEN,
            )
        try:
            result = fn(*args)
            if timed is not None:
                timed.queue_ns = round((started - queued) * 1e9)
                timed.compute_ns = round((time.perf_counter() - started) * 1e9)
                session.quick = timed.compute_ns < INLINE_RUN_S * 1e9
                self.metrics.model_run(session.digest, timed.queue_ns / 1e9, timed.compute_ns / 1e9)
            return result
        except WorkerLost as exc:
            session.broken = str(exc)
            log.warning("session_broken", session=session.id, reason=str(exc))
            raise
        finally:
            session.renew()

    async def run(self, session: Session, arrays: list[np.ndarray], formats: list[InputFormat]) -> Ran:
        """Run one frame (inputs already checked by the frame intake)."""
        start, times = time.perf_counter(), RunTimes()
        outputs = await self.in_session(session, session.runtime.run, arrays, formats, timed=times)
        return Ran(outputs, int((time.perf_counter() - start) * 1e6), times)

    async def version(self, session: Session) -> VersionInfo:
        return await self.blocking(session.runtime.sdk_version) or self.backend.version()

    async def perf(self, session: Session, fix_freq: bool) -> EvalPerfResponse:
        """The session's model timed, with the frequencies it ran at."""
        return await self.in_session(session, self._measure, session.runtime, fix_freq)

    def _measure(self, runtime: ModelRuntime, fix_freq: bool) -> EvalPerfResponse:
        with self.backend.measuring(fix_freq) as pinned:
            result = runtime.perf(None)
            return replace(
                result,
                frequencies=pinned.frequencies,
                frequencies_fixed=pinned.fixed,
                frequency_note=pinned.note,
            )

    async def memory_of(self, session: Session) -> EvalMemoryResponse:
        return await self.in_session(session, session.runtime.memory)

    async def layers(
        self, session: Session, arrays: list[np.ndarray], formats: list[InputFormat]
    ) -> AsyncGenerator[LayerDump, None]:
        """The session's layer dump of one frame, one layer at a time, the session held throughout."""
        # Its steps run on several executor threads, so the compute lock is held for the whole dump.
        async with session.lock, self._computing(session):
            if session.closed:
                raise NotFound(f"session {session.id!r} was closed", reason=Reason.SESSION_NOT_FOUND)
            # Some runtimes start their capture when asked for the iterator: that call blocks too.
            dump = await self.blocking(session.runtime.dump_layers, arrays, formats)
            async with aclosing(self._step(dump)) as layers:
                async for layer in layers:
                    yield layer
                    session.renew()

    @asynccontextmanager
    async def _computing(self, session: Session) -> AsyncIterator[None]:
        """Hold the session's compute lock across several executor jobs (a threading.Lock may be
        released by another thread than the one that took it); taken in the executor, as a doorbell's
        frame may hold it, and given back even when the caller is cancelled meanwhile."""
        taking = asyncio.get_running_loop().run_in_executor(self.executor, session.compute.acquire)
        try:
            await asyncio.shield(taking)
        except asyncio.CancelledError:
            await asyncio.wait([taking])
            session.compute.release()
            raise
        try:
            yield
        finally:
            session.compute.release()

    async def _step(self, layers: Iterator[LayerDump]) -> AsyncGenerator[LayerDump, None]:
        """Advance a runtime's blocking layer iterator in the executor, one layer at a time.

        On an early exit (client gone, send failed) the step in flight is awaited first and the
        iterator is then closed in the executor, never from two threads at once.
        """
        loop = asyncio.get_running_loop()
        step: asyncio.Future[LayerDump | None] | None = None
        try:
            while True:
                step = loop.run_in_executor(self.executor, next, layers, None)
                layer = await asyncio.shield(step)
                if layer is None:
                    return
                yield layer
        finally:
            if step is not None and not step.done():
                await asyncio.wait([step])
            close = getattr(layers, "close", None)
            if close is not None:
                await loop.run_in_executor(self.executor, close)


__all__ = ["DataPlane", "OpenRequest", "Ran", "RunTimes"]
