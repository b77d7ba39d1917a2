"""The data plane in-process: sessions opened, owned, run and closed, and nothing held after a failure."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rknn_proto import codec
from rknn_proto.reasons import Reason
from rknn_server.config.limits import CacheLimits, SessionLimits
from rknn_server.core import data_plane
from rknn_server.core.data_plane import DataPlane, OpenRequest, RunTimes
from rknn_server.errors import DataLoss, FailedPrecondition, NotFound, ResourceExhausted
from rknn_server.observe.metrics import DaemonMetrics
from rknn_server.runtime.base import InputFormat, ModelFormatError, WorkerLost
from rknn_server.store.model_cache import ModelCache
from rknn_server.store.reservations import ReservationBook
from tests.unit.server.fakes import FakeBackend, FakeRuntime, store_model

MODEL = b"not really onnx, the fake backend does not read it" * 10


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


def make_plane(tmp_path: Path, executor: ThreadPoolExecutor, **limits: float) -> tuple[DataPlane, str]:
    cache = ModelCache(tmp_path / "cache", CacheLimits())
    digest = store_model(cache, MODEL)
    for owner in ("", "alice", "bob"):  # the callers these tests open it as uploaded it
        cache.grant(digest, owner)
    plane = DataPlane(
        FakeBackend("rk3588"),
        cache,
        executor,
        DaemonMetrics(),
        codec.TensorLimits(),
        SessionLimits(**limits),  # type: ignore[arg-type]
    )
    return plane, digest


def pins(plane: DataPlane, digest: str) -> int:
    return plane.cache.quota.pinned(digest)


def runtime_of(plane: DataPlane, session_id: str, owner: str) -> FakeRuntime:
    runtime = plane.session(session_id, owner).runtime
    assert isinstance(runtime, FakeRuntime)
    return runtime


def test_open_then_close_pins_and_unpins_the_model_and_frees_the_runtime(tmp_path, executor) -> None:
    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor)
        session = await plane.open(OpenRequest(digest, "alice", target="RK3588", core_mask=1))
        runtime = runtime_of(plane, session.id, "alice")
        assert runtime.options.target == "rk3588" and runtime.options.core_mask == 1
        assert runtime.path == plane.cache.main_file(digest)
        assert pins(plane, digest) == 1 and len(plane.registry) == 1
        await plane.close(session.id, "alice")
        assert runtime.closed and pins(plane, digest) == 0 and len(plane.registry) == 0

    asyncio.run(main())


@pytest.mark.parametrize("failure", ["backend", "damaged", "target", "reserved"])
def test_a_failed_open_holds_no_slot_and_no_pin(tmp_path, executor, failure: str) -> None:
    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor, max_sessions=1)
        target = ""
        if failure == "backend":
            assert isinstance(plane.backend, FakeBackend)
            plane.backend.refuse = ModelFormatError("not a model")
            expected: type[Exception] = ModelFormatError
        elif failure == "damaged":
            plane.cache.main_file(digest).write_bytes(b"x" * len(MODEL))
            expected = DataLoss
        elif failure == "target":
            target, expected = "rk3566", FailedPrecondition
        else:
            book = ReservationBook()
            await book.reserve("bob", 60)
            plane.admit = book.admit
            expected = FailedPrecondition
        with pytest.raises(expected) as caught:
            await plane.open(OpenRequest(digest, "alice", target=target))
        if failure == "reserved":
            assert caught.value.reason is Reason.BOARD_RESERVED  # type: ignore[attr-defined]
        if failure == "target":
            assert caught.value.reason is Reason.TARGET_MISMATCH  # type: ignore[attr-defined]
            assert caught.value.hints == {"board_soc": "rk3588", "target": "rk3566"}  # type: ignore[attr-defined]
        assert pins(plane, digest) == 0 and len(plane.registry) == 0
        if failure == "backend":  # the one slot is free again
            plane.backend.refuse = None  # type: ignore[attr-defined]
            await plane.open(OpenRequest(digest, "alice"))

    asyncio.run(main())


def test_a_session_belongs_to_its_owner(tmp_path, executor) -> None:
    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor)
        session = await plane.open(OpenRequest(digest, "alice"))
        for call in (lambda: plane.session(session.id, "mallory"), lambda: plane.session("f" * 32, "alice")):
            with pytest.raises(NotFound) as caught:
                call()
            assert caught.value.reason is Reason.SESSION_NOT_FOUND
        with pytest.raises(NotFound):
            await plane.close(session.id, "mallory")
        assert not runtime_of(plane, session.id, "alice").closed

    asyncio.run(main())


def test_the_per_client_limit_counts_loads_in_flight(tmp_path, executor) -> None:
    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor, max_sessions=3, max_per_client=1)
        results = await asyncio.gather(
            plane.open(OpenRequest(digest, "alice")),
            plane.open(OpenRequest(digest, "alice")),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, ResourceExhausted)]
        assert len(refused) == 1 and "max_sessions_per_client=1" in str(refused[0])
        assert refused[0].reason is Reason.LIMIT_EXCEEDED
        await plane.open(OpenRequest(digest, "bob"))
        assert pins(plane, digest) == 2

    asyncio.run(main())


def test_run_returns_outputs_and_a_lost_worker_breaks_the_session(tmp_path, executor) -> None:
    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor)
        session = await plane.open(OpenRequest(digest, "alice"))
        x = np.ones((1, 3, 4, 4), np.float32)
        ran = await plane.run(session, [x], [InputFormat("NCHW")])
        np.testing.assert_array_equal(ran.outputs[0], x * 2)
        assert ran.run_time_us >= 0
        assert (
            f'rknn_model_compute_seconds_count{{model="{digest[:12]}"}} 1.0'.encode()
            in plane.metrics.exposition()
        )
        runtime_of(plane, session.id, "alice").fail = WorkerLost("the worker died")
        with pytest.raises(WorkerLost):
            await plane.run(session, [x], [InputFormat("NCHW")])
        with pytest.raises(FailedPrecondition) as caught:
            await plane.run(session, [x], [InputFormat("NCHW")])
        assert caught.value.reason is Reason.SESSION_BROKEN
        await plane.close(session.id, "alice")  # a broken session can still be released
        assert pins(plane, digest) == 0

    asyncio.run(main())


def test_the_reaper_spares_a_busy_session_and_closes_an_idle_one(tmp_path, executor) -> None:
    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor, idle_timeout_s=0.05)
        busy = await plane.open(OpenRequest(digest, "alice"))
        idle = await plane.open(OpenRequest(digest, "bob"))
        busy_runtime = runtime_of(plane, busy.id, "alice")
        busy_runtime.proceed.clear()
        run = asyncio.create_task(plane.run(busy, [np.ones((1, 3, 4, 4), np.float32)], [InputFormat("NCHW")]))
        await asyncio.get_running_loop().run_in_executor(None, busy_runtime.running.wait, 30)
        await asyncio.sleep(0.2)
        await plane.reap()
        assert len(plane.registry) == 1 and pins(plane, digest) == 1
        with pytest.raises(NotFound):
            plane.session(idle.id, "bob")
        busy_runtime.proceed.set()
        await run
        plane.close_all("shutting down")
        assert busy_runtime.closed and pins(plane, digest) == 0

    asyncio.run(main())


def test_a_frame_run_off_the_loop_and_the_executors_calls_take_turns(tmp_path, executor) -> None:
    """A doorbell's thread runs frames through `alone`: a call from the loop waits for its frame in
    flight, the reaper spares it, a close waits for it, and a closed session's next frame does not run."""

    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor, idle_timeout_s=0.1)
        session = await plane.open(OpenRequest(digest, "alice"))
        runtime = runtime_of(plane, session.id, "alice")
        x = np.ones((1, 3, 4, 4), np.float32)
        formats = [InputFormat("NCHW")]
        loop = asyncio.get_running_loop()
        runtime.proceed.clear()
        doorbell = loop.run_in_executor(
            None, plane.alone, session, 0.0, RunTimes(), session.runtime.run, [x], formats
        )
        await loop.run_in_executor(None, runtime.running.wait, 30)
        runtime.running.clear()
        await asyncio.sleep(0.3)
        await plane.reap()
        assert len(plane.registry) == 1  # past its lease, but running a frame: not reaped
        queued = asyncio.create_task(plane.run(session, [x], formats))
        await asyncio.sleep(0.2)
        assert not runtime.running.is_set() and not queued.done()  # it waits for the frame in flight
        runtime.proceed.set()
        np.testing.assert_array_equal((await doorbell)[0], x * 2)
        np.testing.assert_array_equal((await queued).outputs[0], x * 2)
        runtime.proceed.clear()
        doorbell = loop.run_in_executor(
            None, plane.alone, session, 0.0, RunTimes(), session.runtime.run, [x], formats
        )
        await loop.run_in_executor(None, runtime.running.wait, 30)
        closing = asyncio.create_task(plane.close(session.id, "alice"))
        await asyncio.sleep(0.2)
        assert not runtime.closed and not closing.done()  # the runtime is not freed under a frame
        runtime.proceed.set()
        await doorbell
        await closing
        assert runtime.closed and session.closed and pins(plane, digest) == 0
        with pytest.raises(NotFound) as gone:
            plane.alone(session, 0.0, RunTimes(), session.runtime.run, [x], formats)
        assert gone.value.reason is Reason.SESSION_NOT_FOUND

    asyncio.run(main())


def test_quick_runs_of_a_steady_runtime_run_on_the_event_loop_when_nothing_would_make_them_wait(
    tmp_path, executor, monkeypatch
) -> None:
    """The executor's hand-off costs more than a tiny model's run: such runs run on the loop, but
    never a slow one, an unsteady runtime's, or one that would wait behind another call computing.
    ("Quick" is half a second here, so that a loaded machine's pause cannot make a fast run slow.)"""
    monkeypatch.setattr(data_plane, "INLINE_RUN_S", 0.5)

    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor)
        loop_thread = threading.get_ident()
        x = [np.ones((1, 4), np.float32)]
        formats = [InputFormat()]
        quick = await plane.open(OpenRequest(digest, "alice"))
        runtime = runtime_of(plane, quick.id, "alice")

        async def ran_here() -> bool:
            await plane.run(quick, x, formats)
            return runtime.threads[-1] == loop_thread

        runtime.steady = True
        assert not await ran_here()  # the first run's time is not known yet
        assert await ran_here()
        assert await ran_here()
        runtime.steady = False  # an unsteady runtime's quick run may be slow the next time: never here
        assert not await ran_here()
        assert not await ran_here()
        runtime.steady = True
        assert await ran_here()

        runtime.delay_s = 0.6  # slower than INLINE_RUN_S: the next one goes back to the executor
        assert await ran_here()
        runtime.delay_s = 0.0
        assert not await ran_here()
        assert await ran_here()

        other = await plane.open(OpenRequest(digest, "bob"))
        busy = runtime_of(plane, other.id, "bob")
        busy.proceed.clear()
        elsewhere = asyncio.ensure_future(plane.run(other, x, formats))
        await asyncio.get_running_loop().run_in_executor(None, busy.running.wait, 5)
        assert not await ran_here()  # another call computes: this one would wait for the gate
        busy.proceed.set()
        await elsewhere
        assert await ran_here()

    asyncio.run(main())


class GatedBackend(FakeBackend):
    """A backend whose runs wait on a gate of two, as the host runtime's do."""

    parallel_runs = 2
    gated_runs = True


def test_a_gated_backends_runs_queue_for_threads_of_their_own(tmp_path, executor) -> None:
    """Runs beyond the gate's two wait in a queue, not parked on shared executor threads, and every
    run computes on one of the two run threads; untimed calls and other backends' runs stay on the
    shared executor."""

    async def main() -> None:
        plane, digest = make_plane(tmp_path, executor)
        plane = DataPlane(
            GatedBackend("rk3588"), plane.cache, executor, DaemonMetrics(), codec.TensorLimits()
        )
        assert plane.runs is not None
        x = [np.ones((1, 3, 4, 4), np.float32)]
        sessions = [await plane.open(OpenRequest(digest, "alice")) for _ in range(6)]
        runtimes = [runtime_of(plane, s.id, "alice") for s in sessions]
        for runtime in runtimes:
            runtime.delay_s = 0.02
        for _ in range(3):
            await asyncio.gather(*(plane.run(s, x, [InputFormat("NCHW")]) for s in sessions))
        names = {t.ident: t.name for t in threading.enumerate()}
        ran_on = {names[ident] for runtime in runtimes for ident in runtime.threads}
        assert len(ran_on) <= 2 and all(name.startswith("run_") for name in ran_on), ran_on
        shape = await plane.in_session(sessions[0], lambda: threading.current_thread().name)
        assert not shape.startswith("run_")  # not a model run: the shared executor
        plane.shutdown()

        ungated, _ = make_plane(tmp_path / "other", executor)
        assert ungated.runs is None

    asyncio.run(main())
