"""Triton's dynamic batcher for one model: requests of every caller joined along the batch dimension.

A repository model whose config.pbtxt has `dynamic_batching` (and so `max_batch_size` > 0) runs its
requests through one of these. A request, already checked by the intake, waits at most
`max_queue_delay_microseconds` for others to join it (not at all once the batch reaches a preferred
size or `max_batch_size`); the requests taken together are concatenated along the first dimension,
run once, and each gets its own rows of every output back. Requests join only when the rest of their
shapes, their dtypes and their formats agree; others wait for the next batch. A batch that fails
fails each of its requests with the same error (as Triton's does); a caller that went away is left
out of the batch it would have joined. Repository models are shared by every caller, so a batch runs
in any session of the model (V2Models.run_batch picks one that is not busy). Up to `parallel`
batches run at once (the runtime's `parallel_runs`: with one batch at a time, a 2-core PC computed
on one core, and batching measured 0.65x the throughput of no batching); the next batch is
gathered meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from rknn_server.core.data_plane import Ran, RunTimes
from rknn_server.core.sessions import Session
from rknn_server.errors import InvalidInput
from rknn_server.protocols.kserve.pbtxt import Batching
from rknn_server.runtime.base import InputFormat

# Runs one batch, given its requests' sessions (it picks the one to run in).
Run = Callable[[list[Session], list[np.ndarray], list[InputFormat]], Awaitable[Ran]]


@dataclass
class _Request:
    session: Session
    arrays: list[np.ndarray]
    formats: list[InputFormat]
    done: asyncio.Future[Ran]
    queued: int = field(default_factory=time.perf_counter_ns)

    @property
    def size(self) -> int:
        return int(self.arrays[0].shape[0])

    def joins(self, first: _Request) -> bool:
        """Whether this request can share `first`'s batch: all but the batch dimension alike."""
        return self.formats == first.formats and all(
            a.dtype == b.dtype and a.shape[1:] == b.shape[1:]
            for a, b in zip(self.arrays, first.arrays, strict=True)
        )


class DynamicBatcher:
    """The queue of one model's batched requests and the task that gathers them into batches."""

    def __init__(self, run: Run, max_batch_size: int, batching: Batching, parallel: int = 1) -> None:
        self._run = run
        self.max_batch_size = max_batch_size
        self.delay_s = batching.max_queue_delay_us / 1e6
        self.target = max(batching.preferred_batch_sizes, default=max_batch_size)
        self._queue: list[_Request] = []
        self._arrived = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._running = asyncio.Semaphore(max(1, parallel))
        self._batches: set[asyncio.Task[None]] = set()

    async def run(self, session: Session, arrays: list[np.ndarray], formats: list[InputFormat]) -> Ran:
        """Run one request in a batch; its outputs are its own rows."""
        if not arrays or not arrays[0].ndim:
            raise InvalidInput("a batching model's inputs need a batch dimension")
        request = _Request(session, arrays, formats, asyncio.get_running_loop().create_future())
        self._queue.append(request)
        self._arrived.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._serve())
        return await request.done

    def _waiting(self) -> int:
        first = next((r for r in self._queue if not r.done.done()), None)
        return sum(r.size for r in self._queue if not r.done.done() and first and r.joins(first))

    async def _serve(self) -> None:
        while self._queue:
            await self._running.acquire()  # a batch's turn to run: gather it now
            deadline = time.monotonic() + self.delay_s
            while self._waiting() < self.target and (left := deadline - time.monotonic()) > 0:
                self._arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
            batch = self._take()
            if not batch:
                self._running.release()
                continue
            task = asyncio.create_task(self._run_batch(batch))
            self._batches.add(task)
            task.add_done_callback(self._batch_ended)

    def _batch_ended(self, task: asyncio.Task[None]) -> None:
        self._batches.discard(task)
        self._running.release()

    def _take(self) -> list[_Request]:
        """The next batch: the oldest live request and those after it that fit beside it, up to the
        largest preferred size (as Triton forms batches: eight waiting with a preferred size of four
        make two batches, which run side by side), else max_batch_size."""
        self._queue = [r for r in self._queue if not r.done.done()]
        if not self._queue:
            return []
        first, total = self._queue[0], 0
        batch: list[_Request] = []
        rest: list[_Request] = []
        for request in self._queue:
            if request.joins(first) and (not batch or total + request.size <= self.target):
                batch.append(request)
                total += request.size
            else:
                rest.append(request)
        self._queue = rest
        return batch

    async def _run_batch(self, batch: list[_Request]) -> None:
        started = time.perf_counter_ns()
        try:
            joined = [np.concatenate(parts, axis=0) for parts in zip(*(r.arrays for r in batch), strict=True)]
            ran = await self._run([r.session for r in batch], joined, batch[0].formats)
            sizes = [r.size for r in batch]
            total = sum(sizes)
            if any(not out.ndim or out.shape[0] != total for out in ran.outputs):
                raise InvalidInput(
                    f"the model's outputs {[list(o.shape) for o in ran.outputs]} do not start with the batch "
                    f"dimension ({total}), so a batch cannot be split back: remove dynamic_batching"
                )
            cuts = np.cumsum(sizes)[:-1]
            parts = [np.split(out, cuts, axis=0) for out in ran.outputs]
        except Exception as exc:
            for request in batch:
                if not request.done.done():
                    request.done.set_exception(exc)
            return
        for index, request in enumerate(batch):
            if not request.done.done():
                waited = started - request.queued  # in the batcher, before the session's own queue
                times = RunTimes(ran.times.queue_ns + waited, ran.times.compute_ns)
                request.done.set_result(Ran([p[index] for p in parts], ran.run_time_us, times))


__all__ = ["DynamicBatcher"]
