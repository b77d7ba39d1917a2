"""The two loads a step puts on the daemon, and the measurement of one step.

Closed loop (`--concurrency N`): N threads, each with a session of its own, each sending its next
request as soon as the last is answered, so N requests are always in flight. Not N frames on one
session's pipeline: the daemon runs one call at a time per session, so that would measure one
session's queue, not how the daemon serves N clients at once (which is what N applications, or N
cameras, do to a board with several NPU cores).

Open loop (`--request-rate-range`): requests are due on a fixed schedule (t0 + i/rate) whether or not
earlier ones were answered, and their latency runs from the due time, so queueing shows as latency
instead of silently lowering the rate. A pool of sessions carries them; a request due while every
session is busy waits its turn, and one due while as many already wait as there are sessions is
dropped (counted, never sent), so an overloaded daemon shows as drops and a bounded latency.
"""

from __future__ import annotations

import abc
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from rknn_client.errors import RknnError
from rknn_client.frame_spec import FrameSpec
from rknn_client.load.ctrl_c import UNWATCHED, CtrlC
from rknn_client.load.windows import Kind, Outcome, Window, is_stable
from rknn_client.session import Session
from rknn_client.transport.base import TransportError

# A request still unanswered this long after the load stopped is left behind (counted as unresolved).
STOP_WAIT_S = 60.0
PRESSED_CHECK_S = 0.1  # how often a warm-up looks for a Ctrl-C Python did not raise (ctrl_c.py)

Runner = Callable[[], float]  # one request; returns the daemon's run time in microseconds


def runner(session: Session, frame: FrameSpec) -> Runner:
    """One request on `session` (used by one thread only, so its last run time is this run's)."""

    def run() -> float:
        session.run_frame(frame)
        return float(session.last_run_time_us)

    return run


@contextlib.contextmanager
def kept_alive(sessions: Sequence[Session], every_s: float) -> Iterator[None]:
    """Renew the leases of `sessions` every `every_s` while the block runs, from a thread of its own:
    no gRPC call runs on the main thread during a measurement, since a call that Ctrl-C interrupts
    there can leave the channel's calls in other threads hanging."""
    done = threading.Event()

    def keep() -> None:
        while not done.wait(every_s):
            for session in sessions:
                # A failure here shows as the next step's errors, with the daemon's reason.
                with contextlib.suppress(RknnError, TransportError):
                    session.keep_alive()

    thread = threading.Thread(target=keep, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


class Recorder:
    """Requests made and outcomes resolved, from every thread; the measurement takes the outcomes
    window by window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        self.requests = 0
        self.first_error: str | None = None

    def request(self) -> None:
        with self._lock:
            self.requests += 1

    def add(self, outcome: Outcome, error: str | None = None) -> None:
        with self._lock:
            self._outcomes.append(outcome)
            if error is not None and self.first_error is None:
                self.first_error = error

    def take(self) -> tuple[Outcome, ...]:
        """The outcomes resolved since the last take."""
        with self._lock:
            taken, self._outcomes = tuple(self._outcomes), []
        return taken

    def attempt(self, run: Runner, since: float) -> None:
        """Run one request and record it; its latency runs from `since` (a perf_counter time)."""
        try:
            server_us = run()
        except (RknnError, TransportError) as exc:
            self.add(Outcome(Kind.ERROR), str(exc))
            return
        self.add(Outcome(Kind.OK, time.perf_counter() - since, server_us))


class Load(abc.ABC):
    """Threads driving requests from start() until stop(); warm_up() first, on every session."""

    def __init__(self, runners: Sequence[Runner], recorder: Recorder) -> None:
        self.runners = list(runners)
        self.recorder = recorder
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        # Daemon threads: a request hung on a dead link must not keep the CLI from exiting.
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _join(self) -> None:
        deadline = time.monotonic() + STOP_WAIT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def warm_up(self, runs: int, ctrl_c: CtrlC = UNWATCHED) -> None:
        """`runs` requests on each session, all sessions at once, before any window; Ctrl-C ends it."""

        def warm(run: Runner) -> None:
            for _ in range(runs):
                if self._stop.is_set():
                    return
                self.recorder.request()
                self.recorder.attempt(run, time.perf_counter())

        for run in self.runners:
            self._spawn(warm, run)
        for thread in self._threads:
            while thread.is_alive():  # Ctrl-C interrupts a join on POSIX; stop() then ends the warm-up
                thread.join(PRESSED_CHECK_S)
                if ctrl_c.pressed():
                    raise KeyboardInterrupt
        self._threads = []

    @abc.abstractmethod
    def start(self) -> None:
        """Start sending requests (in threads of its own) and return."""

    def stop(self) -> None:
        """No new requests; those in flight are answered (and recorded) before this returns."""
        self._stop.set()
        self._join()


class ClosedLoop(Load):
    """Each session sends its next request when the last is answered: len(runners) in flight."""

    def start(self) -> None:
        for run in self.runners:
            self._spawn(self._loop, run)

    def _loop(self, run: Runner) -> None:
        while not self._stop.is_set():
            self.recorder.request()
            self.recorder.attempt(run, time.perf_counter())


class OpenLoop(Load):
    """`rate` requests per second on a fixed schedule, carried by the sessions of `runners`."""

    def __init__(self, runners: Sequence[Runner], recorder: Recorder, rate: float) -> None:
        super().__init__(runners, recorder)
        self.rate = rate
        self._due: queue.Queue[float | None] = queue.Queue()
        self._scheduler: threading.Thread | None = None

    def start(self) -> None:
        for run in self.runners:
            self._spawn(self._serve, run)
        self._scheduler = threading.Thread(target=self._schedule, args=(time.perf_counter(),), daemon=True)
        self._scheduler.start()

    def _schedule(self, t0: float) -> None:
        i = 0
        while True:
            due = t0 + i / self.rate
            if self._stop.wait(max(0.0, due - time.perf_counter())):
                return
            self.recorder.request()
            if self._due.qsize() >= len(self.runners):
                self.recorder.add(Outcome(Kind.DROP))
            else:
                self._due.put(due)
            i += 1

    def _serve(self, run: Runner) -> None:
        while (due := self._due.get()) is not None:
            self.recorder.attempt(run, due)

    def stop(self) -> None:
        """Stop the schedule, drop what still waits, let the sessions finish what they carry."""
        self._stop.set()
        if self._scheduler is not None:
            self._scheduler.join()
        while True:
            try:
                waiting = self._due.get_nowait()
            except queue.Empty:
                break
            if waiting is not None:
                self.recorder.add(Outcome(Kind.DROP))
        for _ in self.runners:
            self._due.put(None)
        self._join()


@dataclass(frozen=True)
class Settings:
    """perf_analyzer's knobs: window length, stability rule, most windows per step; warm-up runs."""

    interval_s: float
    stability_percent: float
    max_windows: int
    warmup: int


@dataclass
class Step:
    """What one step measured; filled as it runs, so an interrupted step keeps what it has."""

    concurrency: int | None = None
    rate: float | None = None
    sessions: int = 0
    warmup: tuple[Outcome, ...] = ()
    windows: list[Window] = field(default_factory=list)
    after: tuple[Outcome, ...] = ()
    requests: int = 0
    stable: bool = False
    interrupted: bool = False
    failed: bool = False
    first_error: str | None = None

    @property
    def unresolved(self) -> int:
        """Requests left behind unanswered (0 unless the daemon hung past STOP_WAIT_S)."""
        resolved = len(self.warmup) + sum(len(w.outcomes) for w in self.windows) + len(self.after)
        return self.requests - resolved


def measure(
    load: Load,
    step: Step,
    settings: Settings,
    on_window: Callable[[Window], None] = lambda _: None,
    ctrl_c: CtrlC = UNWATCHED,
) -> Step:
    """Warm-up, then windows until the last ones are stable or `max_windows` ran, each handed to
    `on_window` as it closes. The step ends early, keeping what it measured, on Ctrl-C
    (step.interrupted; not raised: a KeyboardInterrupt, or `ctrl_c`'s record of one that Python
    lost or is slow to raise, see ctrl_c.py) or when every request of the warm-up or of a window
    failed (step.failed)."""
    recorder = load.recorder
    try:
        load.warm_up(settings.warmup, ctrl_c)
        step.warmup = recorder.take()
        step.failed = _all_failed(step.warmup)
        if not step.failed:
            load.start()
        while not step.failed and len(step.windows) < settings.max_windows:
            begin = time.perf_counter()
            if ctrl_c.pause(settings.interval_s):
                raise KeyboardInterrupt  # the window it came in is not a whole window: not kept
            step.windows.append(Window(time.perf_counter() - begin, recorder.take()))
            on_window(step.windows[-1])
            step.failed = _all_failed(step.windows[-1].outcomes)
            if is_stable(step.windows, settings.stability_percent):
                step.stable = True
                break
    except KeyboardInterrupt:
        step.interrupted = True
    finally:
        load.stop()
        step.after = recorder.take()
        step.requests = recorder.requests
        step.first_error = recorder.first_error
    return step


def _all_failed(outcomes: Sequence[Outcome]) -> bool:
    """Whether these were errors only: the daemon refusing or gone, not something to measure."""
    kinds = {o.kind for o in outcomes}
    return Kind.ERROR in kinds and Kind.OK not in kinds


@dataclass
class Sweep:
    """The steps of one sweep, in order; `interrupted` when Ctrl-C ended it early."""

    open_loop: bool
    settings: Settings
    sessions: int
    steps: list[Step] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None  # why the sweep stopped before its last step, when a step failed
