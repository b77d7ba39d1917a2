"""The load-testing options of `rknn-client perf` and the sweep they ask for.

perf_analyzer's vocabulary and defaults (--concurrency-range, --request-rate-range,
--measurement-interval 5000 ms, --stability-percentage 10, --max-trials 10), so a user of one reads
the other. The model is uploaded once; the sessions are opened once and reused by every step.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable

from rknn_client.device import DeviceInfo
from rknn_client.errors import RknnError
from rknn_client.frame_spec import FrameSpec
from rknn_client.load import ranges
from rknn_client.load.ctrl_c import CtrlC, watching
from rknn_client.load.drivers import (
    ClosedLoop,
    Load,
    OpenLoop,
    Recorder,
    Settings,
    Step,
    Sweep,
    kept_alive,
    measure,
    runner,
)
from rknn_client.load.output import progress_line, step_name, window_line
from rknn_client.session import Session
from rknn_client.transport.base import TransportError

DEFAULT_MAX_IN_FLIGHT = 4
# How often idle sessions are renewed when the daemon does not say when it expires them.
KEEP_ALIVE_S = 60.0
MODES = "--concurrency N, --concurrency-range START:END[:STEP] or --request-rate-range START:END[:STEP]"


def add_load_options(perf: argparse.ArgumentParser) -> None:
    group = perf.add_argument_group(
        "load testing",
        "many requests at once, or at a set rate, measured in windows until stable (as perf_analyzer "
        "does); prints one row per step instead of the single-session report",
    )
    mode = group.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency",
        type=ranges.concurrency,
        metavar="N",
        help="N sessions, each sending its next request when the last is answered",
    )
    mode.add_argument(
        "--concurrency-range",
        type=ranges.concurrency_range,
        metavar="RANGE",
        help="START:END[:STEP]: one step per concurrency, e.g. 1:8 or 1:16:2",
    )
    mode.add_argument(
        "--request-rate-range",
        type=ranges.rate_range,
        metavar="RANGE",
        help="START:END[:STEP], open loop: requests per second on a fixed schedule, latency from "
        "the scheduled time; one step per rate, e.g. 10:50:10",
    )
    group.add_argument(
        "--max-in-flight",
        type=ranges.positive_int,
        metavar="N",
        help="open loop: sessions carrying the scheduled requests; a request due while N already wait "
        f"is dropped (default: {DEFAULT_MAX_IN_FLIGHT})",
    )
    group.add_argument(
        "--measurement-interval",
        type=ranges.positive_int,
        default=5000,
        metavar="MS",
        help="window length in milliseconds (default: %(default)s)",
    )
    group.add_argument(
        "--stability-percentage",
        type=ranges.positive_float,
        default=10.0,
        metavar="PCT",
        help="stable when the last 3 windows' throughput and mean latency vary by at most this "
        "(max over min; default: %(default)s)",
    )
    group.add_argument(
        "--max-trials",
        type=ranges.positive_int,
        default=10,
        metavar="N",
        help="most windows per step, stable or not (default: %(default)s)",
    )
    group.add_argument("--csv", action="store_true", help="print CSV, one row per step, instead of the table")
    perf.set_defaults(check_options=check_load_options)


def load_values(args: argparse.Namespace) -> list[float] | None:
    """The steps of the sweep asked for, or None for the single-session report."""
    return args.concurrency or args.concurrency_range or args.request_rate_range


def check_load_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the combination of options, or None."""
    if load_values(args) is None:
        for flag, given in (("--csv", args.csv), ("--max-in-flight", args.max_in_flight is not None)):
            if given:
                return f"{flag} belongs to a load test: add {MODES}"
        return None
    if args.csv and args.json:
        return "--json and --csv both given: pick one output format"
    if args.max_in_flight is not None and args.request_rate_range is None:
        return "--max-in-flight is for --request-rate-range (a closed loop keeps --concurrency requests in flight)"
    if args.runs is not None:
        return "--runs counts the single-session report's runs; a load test measures in windows (--measurement-interval, --max-trials)"
    return None


def check_session_room(info: DeviceInfo, needed: int, what: str) -> None:
    """Refuse early, and say why, a sweep needing more sessions than the daemon has room for."""
    rooms = []
    if most := int(info.limits.get("max_sessions", 0)):
        rooms.append((most - info.open_sessions, f"--max-sessions {most}, {info.open_sessions} open now"))
    if per_client := int(info.limits.get("max_sessions_per_client", 0)):
        rooms.append((per_client, f"--max-sessions-per-client {per_client}"))
    room, why = min(rooms, default=(needed, ""))
    if needed > room:
        raise ValueError(
            f"{what} needs {needed} sessions at once; the daemon has room for {max(room, 0)} ({why}). "
            "Ask for fewer, or start rknn_server with more"
        )


def _release_quietly(session: Session) -> None:
    """Release at the end of a sweep; a daemon already gone lets the lease run out instead."""
    try:
        session.release()
    except (RknnError, TransportError) as exc:
        print(
            f"note: session not released ({exc}); the daemon frees it when its lease runs out",
            file=sys.stderr,
        )


def run_sweep(
    args: argparse.Namespace,
    info: DeviceInfo,
    open_session: Callable[[], Session],
    frame_of: Callable[[Session], FrameSpec],
) -> Sweep:
    """Every step in turn, a progress line on stderr after each. Ctrl-C, or a step whose every request
    failed, ends the sweep with the steps measured so far (that step included, marked)."""
    values = load_values(args)
    assert values is not None
    open_loop = args.request_rate_range is not None
    needed = (args.max_in_flight or DEFAULT_MAX_IN_FLIGHT) if open_loop else int(max(values))
    check_session_room(info, needed, "--max-in-flight" if open_loop else f"concurrency {needed}")
    settings = Settings(
        interval_s=args.measurement_interval / 1000,
        stability_percent=args.stability_percentage,
        max_windows=args.max_trials,
        warmup=max(args.warmup, 0),
    )
    sweep = Sweep(open_loop, settings, needed)
    keep_alive_s = info.limits.get("session_idle_timeout_s", 0) / 3 or KEEP_ALIVE_S
    with watching() as ctrl_c, contextlib.ExitStack() as stack:
        try:
            sessions = []
            for _ in range(needed):
                sessions.append(open_session())
                stack.callback(_release_quietly, sessions[-1])
        except KeyboardInterrupt:
            # A gRPC call that Ctrl-C interrupted may leave the channel's other calls hanging: the
            # daemon frees the sessions when their leases run out instead.
            stack.pop_all()
            print("interrupted while opening sessions: nothing measured", file=sys.stderr)
            sweep.interrupted = True
            return sweep
        frame = frame_of(sessions[0])
        for value in values:
            step = _run_step(sessions, frame, value, open_loop, settings, keep_alive_s, ctrl_c)
            sweep.steps.append(step)
            if step.failed:
                sweep.error = (
                    f"every request of {step_name(step)} failed, the sweep stopped: {step.first_error}"
                )
            sweep.interrupted = step.interrupted
            if step.failed or step.interrupted:
                break
    return sweep


def _run_step(
    sessions: list[Session],
    frame: FrameSpec,
    value: float,
    open_loop: bool,
    settings: Settings,
    keep_alive_s: float,
    ctrl_c: CtrlC,
) -> Step:
    """One step on the first `value` sessions (closed loop) or on all of them at `value` per second.
    The sessions a closed-loop step leaves idle are kept alive, or a long step would let the daemon
    expire the ones the next steps need."""
    recorder = Recorder()
    load: Load
    if open_loop:
        used, step = sessions, Step(rate=value, sessions=len(sessions))
        load = OpenLoop([runner(s, frame) for s in used], recorder, value)
    else:
        used, step = sessions[: int(value)], Step(concurrency=int(value), sessions=int(value))
        load = ClosedLoop([runner(s, frame) for s in used], recorder)
    print(f"{step_name(step)}:", file=sys.stderr)
    with kept_alive(sessions[len(used) :], keep_alive_s):
        measure(
            load,
            step,
            settings,
            lambda w: print(window_line(len(step.windows), w), file=sys.stderr),
            ctrl_c,
        )
    print(progress_line(step), file=sys.stderr)
    return step
