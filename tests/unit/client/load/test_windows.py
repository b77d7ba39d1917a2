"""The measurement of `rknn-client perf` load tests, in-process with stand-in requests: percentiles,
windows and the stability rule, and that every request a load makes ends up counted exactly once."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from rknn_client.errors import RknnError
from rknn_client.load.ctrl_c import CtrlC, watching
from rknn_client.load.drivers import (
    ClosedLoop,
    OpenLoop,
    Recorder,
    Runner,
    Settings,
    Step,
    measure,
)
from rknn_client.load.windows import Kind, Outcome, Percentiles, Summary, Window, is_stable

QUICK = Settings(interval_s=0.1, stability_percent=10.0, max_windows=3, warmup=2)


def window(throughput: float, latency_s: float = 0.01, duration_s: float = 1.0) -> Window:
    return Window(
        duration_s, tuple(Outcome(Kind.OK, latency_s) for _ in range(round(throughput * duration_s)))
    )


def accounted(step: Step) -> int:
    return len(step.warmup) + sum(len(w.outcomes) for w in step.windows) + len(step.after)


def test_percentiles_interpolate_between_ranks_and_are_nan_for_nothing() -> None:
    p = Percentiles.of([float(v) for v in range(1, 102)])  # 1..101: the k-th percentile is 1 + k
    assert (p.avg, p.p50, p.p90, p.p99) == (51.0, 51.0, 91.0, 100.0)
    assert all(math.isnan(v) for v in vars(Percentiles.of([])).values())


def test_a_window_counts_each_kind_and_its_throughput_is_completions_per_second() -> None:
    outcomes = (
        *(Outcome(Kind.OK, 0.002, 500.0) for _ in range(10)),
        Outcome(Kind.ERROR),
        Outcome(Kind.ERROR),
        Outcome(Kind.DROP),
    )
    w = Window(2.0, outcomes)
    assert (w.completed, w.count(Kind.ERROR), w.count(Kind.DROP)) == (10, 2, 1)
    assert w.throughput == 5.0
    assert w.latencies_s == [0.002] * 10 and w.server_us == [500.0] * 10


def test_stable_means_the_last_three_windows_agree_on_throughput_and_mean_latency() -> None:
    assert is_stable([window(10), window(100), window(105), window(109)], 10.0)  # the first is ignored
    assert not is_stable([window(100), window(105)], 10.0)  # fewer than three
    assert not is_stable([window(100), window(100), window(115)], 10.0)  # throughput spread 15%
    assert not is_stable([window(100, 0.010), window(100, 0.010), window(100, 0.012)], 10.0)  # latency 20%
    assert is_stable([window(100, 0.010), window(100, 0.010), window(100, 0.012)], 25.0)
    assert not is_stable([window(0), window(0), window(0)], 10.0)  # nothing completed: nothing to judge


def test_a_steps_figures_come_from_its_last_three_windows() -> None:
    windows = [window(1000, 0.5), window(100, 0.010), window(100, 0.010), Window(1.0, (Outcome(Kind.DROP),))]
    s = Summary.of(windows)
    assert (s.windows, s.duration_s, s.completed, s.drops) == (3, 3.0, 200, 1)
    assert s.throughput == pytest.approx(200 / 3)
    assert s.latency_ms.p99 == pytest.approx(10.0)


class CountingRunner:
    """A 5 ms stand-in request that counts how many run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def __call__(self) -> float:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.005)
        with self.lock:
            self.running -= 1
        return 123.0


@pytest.mark.parametrize("sessions", [1, 4])
def test_a_closed_loop_keeps_n_in_flight_and_every_request_is_counted_once(sessions: int) -> None:
    counting = CountingRunner()
    recorder = Recorder()
    step = measure(ClosedLoop([counting] * sessions, recorder), Step(concurrency=sessions), QUICK)
    assert counting.most == sessions
    assert len(step.warmup) == QUICK.warmup * sessions
    assert 1 <= len(step.windows) <= QUICK.max_windows
    assert step.requests == accounted(step) and step.unresolved == 0
    assert all(o.kind is Kind.OK and o.server_us == 123.0 for w in step.windows for o in w.outcomes)
    assert counting.running == 0  # stop() waited for the requests in flight


def test_an_open_loop_drops_what_finds_the_queue_full_and_times_from_the_schedule() -> None:
    release = threading.Event()

    def stalls_until_released() -> float:  # the daemon stalls for the whole first window
        release.wait(30)
        return 0.0

    recorder = Recorder()
    settings = Settings(interval_s=0.2, stability_percent=10.0, max_windows=2, warmup=0)
    load = OpenLoop([stalls_until_released] * 2, recorder, rate=1000.0)
    step = measure(load, Step(rate=1000.0), settings, lambda _: release.set())
    first = step.windows[0]
    # Two sessions busy, two requests waiting: everything else due in the first window was dropped.
    assert first.completed == 0 and first.count(Kind.DROP) >= 10
    assert step.requests == accounted(step) and step.unresolved == 0
    # The two stalled requests and the two that waited behind them: each timed from when it was due,
    # so the waiting ones show the stall too (timed from their send, they would look instant).
    later = [o for w in step.windows[1:] for o in w.outcomes] + list(step.after)
    assert sum(1 for o in later if o.kind is Kind.OK and o.latency_s >= 0.15) >= 4


def test_a_step_whose_every_request_fails_ends_early_and_keeps_the_daemons_error() -> None:
    def failing() -> float:
        raise RknnError("Run on tcp://board: the model has 1 input(s); 2 were given")

    step = measure(ClosedLoop([failing, failing], Recorder()), Step(concurrency=2), QUICK)
    assert step.failed and not step.windows  # the warm-up already failed: no window was measured
    assert step.first_error == "Run on tcp://board: the model has 1 input(s); 2 were given"
    assert step.requests == accounted(step) == 2 * QUICK.warmup


def test_a_daemon_lost_mid_step_ends_it_at_the_first_window_of_only_failures() -> None:
    lost = threading.Event()

    def until_lost() -> float:
        if lost.is_set():
            raise RknnError("Run on tcp://board: connection refused")
        time.sleep(0.002)
        return 0.0

    settings = Settings(interval_s=0.1, stability_percent=1e-9, max_windows=50, warmup=1)
    step = measure(ClosedLoop([until_lost], Recorder()), Step(concurrency=1), settings, lambda _: lost.set())
    # The request in flight when the daemon went may still answer in the second window: the first
    # window with nothing but failures (the second or the third) ends the step.
    assert step.failed and 2 <= len(step.windows) <= 3 and step.windows[0].completed > 0
    assert step.windows[-1].completed == 0 and step.windows[-1].count(Kind.ERROR) > 0
    assert step.requests == accounted(step)


def test_ctrl_c_ends_the_step_with_what_it_measured() -> None:
    def interrupt(_: Window) -> None:
        raise KeyboardInterrupt

    runners: list[Runner] = [CountingRunner(), CountingRunner()]
    step = measure(ClosedLoop(runners, Recorder()), Step(concurrency=2), QUICK, interrupt)
    assert step.interrupted and not step.stable and len(step.windows) == 1
    assert step.requests == accounted(step) and step.unresolved == 0


@pytest.fixture
def ctrl_c_works() -> Iterator[None]:
    """SIGINT handled as at a terminal, even in a test run started with it ignored (a background job)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _InterruptedWhileCollected:
    """Ctrl-C pressed while the garbage collector runs this object's finalizer on the main thread."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs (and raises) here, inside the finalizer
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.usefixtures("ctrl_c_works")
def test_a_ctrl_c_whose_keyboard_interrupt_was_lost_still_ends_the_step() -> None:
    """Python prints a KeyboardInterrupt raised inside a finalizer as "Exception ignored" and goes
    on: without its record, a sweep would measure on until killed."""
    with watching() as ctrl_c:
        _InterruptedWhileCollected()  # collected at once: no KeyboardInterrupt reaches this test
        assert ctrl_c.pressed()
        runners: list[Runner] = [CountingRunner()]
        step = measure(ClosedLoop(runners, Recorder()), Step(concurrency=1), QUICK, ctrl_c=ctrl_c)
    assert step.interrupted and not step.windows  # pressed before the step: it ends in its warm-up
    assert step.requests == accounted(step) and step.unresolved == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.usefixtures("ctrl_c_works")
def test_a_ctrl_c_python_never_raised_ends_the_window_it_came_in() -> None:
    """The signal handled where Python's handler does not run (here: ignored, as if the main thread
    never got to it): the wakeup byte the interpreter writes for it still ends the step."""
    windows: list[Window] = []

    def press_once(window: Window) -> None:
        windows.append(window)
        if len(windows) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with watching() as ctrl_c:
        signal.signal(signal.SIGINT, lambda *_: None)  # the Python-level part: nothing
        runners: list[Runner] = [CountingRunner()]
        unstable = dataclasses.replace(QUICK, stability_percent=0.0, max_windows=2)
        step = measure(ClosedLoop(runners, Recorder()), Step(concurrency=1), unstable, press_once, ctrl_c)
    assert step.interrupted and len(step.windows) == 1  # missed, the second window would have run
    assert step.requests == accounted(step) and step.unresolved == 0


def test_a_press_acted_on_from_its_wakeup_byte_raises_no_second_keyboard_interrupt() -> None:
    """Python's handler may run long after the byte was seen and the step ended: that late run must
    not raise into the sweep's clean-up; a second press still raises."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    with reader, writer:
        ctrl_c = CtrlC(reader)
        assert not ctrl_c.pause(0.01)
        writer.send(bytes([signal.SIGINT]))
        assert ctrl_c.pause(10)  # at once: the byte is there
        ctrl_c.handle(signal.SIGINT, None)  # the late run for that press: nothing
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.handle(signal.SIGINT, None)  # another press


def test_a_sigint_the_process_was_started_ignoring_stays_ignored() -> None:
    """`nohup rknn-client perf ... &` asked for Ctrl-C to be ignored: the sweep must not take it back."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with watching() as ctrl_c:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not ctrl_c.pause(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
