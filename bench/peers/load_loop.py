"""The load loop both drivers share (standard library only: it runs in the tritonclient venv too).

A driver reads one JSON job a line from stdin; for each it starts one thread per caller, and each
thread makes its own client (and connection: tritonclient's HTTP client works only in the thread
that made it) and warms it up. Then the driver prints {"warm": true} and waits for a "go" line
({"warm": false, "errors": [...]} and on to the next job when a caller failed), so that the bench reads the server's CPU only around the measured window; every thread
calls for the job's seconds, and it prints {"latencies_s": [...], "wall_s": ..., "errors": [...]}.
The clients close after the window: a job leaves no session open on the server for the next."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

Call = Callable[[], object]
Caller = tuple[Call, Callable[[], None]]  # one request; closing its client (and connection)
MakeCaller = Callable[[dict[str, Any]], Caller]
WARM_CALLS = 3


class _Load:
    """The job's threads, parked between warm-up and the measured window."""

    def __init__(self, make_caller: MakeCaller, job: dict[str, Any]) -> None:
        count = int(job["concurrency"])
        self.latencies: list[list[float]] = [[] for _ in range(count)]
        self.ends = [0.0] * count
        self.errors: list[str] = []
        self.warm = threading.Barrier(count + 1)
        self.go = threading.Barrier(count + 1)
        self.done = threading.Barrier(count)
        self.deadline = 0.0
        self.threads = [
            threading.Thread(target=self._caller, args=(make_caller, job, i), daemon=True)
            for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _caller(self, make_caller: MakeCaller, job: dict[str, Any], index: int) -> None:
        call: Call | None = None
        close: Callable[[], None] = _nothing
        try:
            call, close = make_caller(job)
            for _ in range(WARM_CALLS):
                call()
        except Exception as exc:  # reported, never hangs the bench
            self._failed(exc)
            call = None
        self.warm.wait()
        self.go.wait()
        mine = self.latencies[index]
        try:
            while call is not None and (now := time.perf_counter()) < self.deadline:
                call()
                self.ends[index] = time.perf_counter()
                mine.append(self.ends[index] - now)
        except Exception as exc:
            self._failed(exc)
        self.done.wait()  # every thread's window is over before any connection closes
        close()

    def _failed(self, exc: Exception) -> None:
        self.errors.append(f"{type(exc).__name__}: {exc}"[:500])

    def run(self, seconds: float) -> dict[str, Any]:
        began = time.perf_counter()
        self.deadline = began + seconds
        self.go.wait()
        for thread in self.threads:
            thread.join()
        return {
            "latencies_s": [s for mine in self.latencies for s in mine],
            "wall_s": max(self.ends) - began if any(self.ends) else seconds,
            "errors": self.errors,
        }


def _nothing() -> None:
    """The close of a caller that was never made."""


def serve_jobs(make_caller: MakeCaller) -> None:
    """Run the jobs of stdin; `make_caller(job)` makes one thread's caller, in that thread."""
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        load = _Load(make_caller, job)
        load.warm.wait()
        if load.errors:  # no window: the threads go at once, close, and the next job comes
            print(json.dumps({"warm": False, "errors": load.errors}), flush=True)
            load.run(0.0)
            continue
        print(json.dumps({"warm": True, "errors": []}), flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        print(json.dumps(load.run(float(job["seconds"]))), flush=True)
