"""`rknn-client farm ...`: list a farm's devices, fan a model out over them.

rknn-client farm devices --farm farm.toml [--devices ADDR ...] [--json]
rknn-client farm check (farm.toml [--devices ADDR ...] | --labgrid [HOST:PORT] [--soc S] [--label K=V]) [--json]
rknn-client farm run MODEL --input a.npy (--farm farm.toml | --devices ADDR[,ADDR] | --labgrid [HOST:PORT])
    [--soc rk3588] [--label rack=r1] [--priority P] [--reference host|device:NAME] [--runs N] [--warmup N]
    [--json report.json] [--html report.html]

With --labgrid (or no other source while labgrid's LG_COORDINATOR is set) the devices are the places
of labgrid's coordinator whose tags match --soc and --label (rknn_client.farm.labgrid_farm); a run
waits for them in labgrid's queue at --priority.

`farm run` exits 0 when every device ran and agreed with the reference, 3 when any failed or
disagreed (the report says which), 1 on a usage or farm-file error, 130 when interrupted: the
first Ctrl-C cancels the running devices, releases every reservation and writes the partial
report; a second one exits at once. `farm check` exits 0 when the inventory is valid and every
device answers, 1 otherwise (each problem on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rknn_client.farm.check import (
    CheckResult,
    check,
    check_devices,
    gather_labgrid,
    normalized_toml,
    result_dict,
    status_table,
)
from rknn_client.farm.inventory import FarmConfigError
from rknn_client.farm.labgrid_farm import LabgridFarm
from rknn_client.farm.pool import Farm
from rknn_client.farm.probe import DeviceStatus
from rknn_client.farm.progress import FanoutProgress
from rknn_client.farm.report import table_text, write_html, write_json
from rknn_client.farm.runner import Timing, entries_matching, run_fanout

EXIT_DEVICES_FAILED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _addresses(values: list[str] | None) -> list[str]:
    return [a.strip() for v in values or [] for a in v.split(",") if a.strip()]


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not a label; expected KEY=VALUE")
    return key, value


def farm_from_args(args: argparse.Namespace) -> Farm:
    addresses = _addresses(args.devices)
    if not args.farm and not addresses:
        raise FarmConfigError("no devices: give --farm farm.toml and/or --devices tcp://HOST:PORT,...")
    return Farm.from_sources(args.farm, addresses)


def labgrid_tags(args: argparse.Namespace, other_source: object) -> dict[str, str] | None:
    """The tag filter when a command works on labgrid's places (--labgrid, or LG_COORDINATOR and no
    `other_source`); None when it works on a farm file or addresses."""
    if args.labgrid is None and (other_source or "LG_COORDINATOR" not in os.environ):
        return None
    if other_source:
        raise FarmConfigError("give either --labgrid or a farm file/--devices, not both")
    labels = dict(args.label or [])
    return {"soc": args.soc.lower(), **labels} if args.soc else labels


def add_labgrid_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--labgrid",
        nargs="?",
        const="",
        metavar="HOST:PORT",
        help="the places of labgrid's coordinator (default: $LG_COORDINATOR, else 127.0.0.1:20408) whose "
        f"tags match --soc and --label, {what}",
    )
    parser.add_argument("--soc", help="only devices of this SoC")
    parser.add_argument(
        "--label", action="append", type=_label, metavar="KEY=VALUE", help="only devices with this label"
    )


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """--farm and --devices, for any command that works on a farm."""
    parser.add_argument("--farm", type=Path, help="farm.toml describing the devices")
    parser.add_argument(
        "--devices",
        action="append",
        metavar="ADDR[,ADDR]",
        help="tcp://HOST:PORT, dns://NAME:PORT (every address of NAME), adb:SERIAL or adb (every attached board)",
    )


def status_rows(statuses: list[DeviceStatus]) -> list[list[str]]:
    rows = [["name", "address", "health", "soc", "daemon", "runtime", "sessions", "reserved by", "labels"]]
    for s in statuses:
        labels = ",".join(f"{k}={v}" for k, v in s.entry.labels.items())
        if not s.healthy:
            rows.append(
                [
                    s.entry.name,
                    s.entry.address,
                    "DOWN",
                    s.entry.labels.get("soc", "?"),
                    "",
                    "",
                    "",
                    "",
                    labels,
                ]
            )
            continue
        rows.append(
            [
                s.entry.name,
                s.entry.address,
                "ok",
                s.soc or "any",
                s.daemon_version,
                f"{s.runtime} {s.runtime_version}",
                str(s.open_sessions),
                s.reserved_by + (f" (+{s.reservation_waiters} waiting)" if s.reservation_waiters else ""),
                labels,
            ]
        )
    return rows


def cmd_devices(args: argparse.Namespace) -> int:
    statuses = farm_from_args(args).statuses()
    if args.json:
        print(json.dumps([{**asdict(s), "entry": _entry_dict(s)} for s in statuses], indent=2))
        return 0
    rows = status_rows(statuses)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for s in statuses:
        if not s.healthy:
            print(f"{s.entry.name}: {s.error}", file=sys.stderr)
    return 0


def checked(args: argparse.Namespace) -> CheckResult:
    addresses = _addresses(args.devices)
    tags = labgrid_tags(args, args.farm_file or addresses)
    if tags is not None:
        return check_devices(gather_labgrid(args.labgrid or None, tags))
    if args.soc or args.label:
        raise FarmConfigError("--soc and --label choose labgrid's places: a farm file is checked whole")
    if not args.farm_file and not addresses:
        raise FarmConfigError(
            "nothing to check: give farm.toml and/or --devices tcp://HOST:PORT,... or --labgrid"
        )
    return check(args.farm_file, addresses)


def cmd_check(args: argparse.Namespace) -> int:
    result = checked(args)
    if args.json:
        print(json.dumps(result_dict(result), indent=2))
    else:  # stdout stays valid TOML (`farm check farm.toml > normalized.toml`); the rest on stderr
        print(normalized_toml(result.entries), end="")
        print(status_table(result.statuses), end="", file=sys.stderr)
    for problem in result.problems:
        print(f"problem: {problem}", file=sys.stderr)
    count = len(result.problems)
    verdict = f"{count} problem(s)" if count else f"ok: {len(result.entries)} device(s), all reachable"
    print(verdict, file=sys.stderr)
    return 1 if count else 0


def _entry_dict(status: DeviceStatus) -> dict[str, object]:
    """An entry without its credentials."""
    e = status.entry
    return {"name": e.name, "address": e.address, "labels": dict(e.labels), "auth": e.auth is not None}


@contextlib.contextmanager
def interrupt_cancels(farm: Farm | LabgridFarm) -> Iterator[None]:
    """While inside: the first SIGINT cancels the farm (in a thread of its own: a signal handler must
    not block on the network), the second ends the process at once, without a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def second(signum: int, frame: object) -> None:
        os._exit(EXIT_INTERRUPTED)

    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, second)
        print(
            "\ninterrupted: cancelling the running devices and releasing every reservation", file=sys.stderr
        )
        threading.Thread(target=farm.cancel, name="farm-cancel").start()

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_run(args: argparse.Namespace) -> int:
    labels = dict(args.label or [])
    tags = labgrid_tags(args, args.farm or args.devices)
    farm = (
        farm_from_args(args)
        if tags is None
        else LabgridFarm(args.labgrid or None, tags, priority=args.priority)
    )
    inputs = [np.load(p) for p in args.input]
    timing = Timing(warmup=args.warmup, runs=args.runs)
    with interrupt_cancels(farm):
        # Labgrid chose the places by their tags already; a farm's devices are chosen here.
        entries = farm.entries if isinstance(farm, LabgridFarm) else entries_matching(farm, args.soc, labels)
        if not entries:
            raise FarmConfigError(f"no device of the farm matches soc={args.soc or 'any'} labels={labels}")
        progress = None if args.quiet else FanoutProgress([e.name for e in entries], timing, sys.stderr)
        try:
            report = run_fanout(
                farm,
                Path(args.model),
                inputs,
                entries=entries,
                reference=args.reference,
                reference_model=args.reference_model,
                concurrency=args.concurrency,
                threshold=args.threshold,
                reserve_timeout_s=args.reserve_timeout,
                observer=progress or (lambda name, stage: None),
                timing=timing,
            )
        finally:
            if progress is not None:
                progress.close()
        print(table_text(report), end="")
        if args.json:
            write_json(report, args.json)
        if args.html:
            write_html(report, args.html)
    if report.cancelled:
        return EXIT_INTERRUPTED
    good = all(r.ok and r.agrees is not False for r in report.devices)
    return 0 if good else EXIT_DEVICES_FAILED


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; expected a count >= 0")
    return value


def add_farm_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `farm devices`, `farm check` and `farm run` on rknn-client's subcommands. Each sets
    `standalone` (it needs no single connected device)."""
    farm = subparsers.add_parser("farm", help="test farms: list devices, fan a model out over many boards")
    sub = farm.add_subparsers(dest="farm_command", required=True)
    devices = sub.add_parser("devices", help="list the farm's devices with health, SoC, versions and load")
    add_source_options(devices)
    devices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    devices.set_defaults(standalone=cmd_devices)
    checker = sub.add_parser(
        "check", help="validate a farm.toml (printed normalized) and reach each device (health and GetInfo)"
    )
    checker.add_argument("farm_file", type=Path, nargs="?", help="farm.toml to check")
    checker.add_argument("--devices", action="append", metavar="ADDR[,ADDR]", help="more devices to check")
    checker.add_argument("--json", action="store_true", help="print the result as JSON")
    add_labgrid_options(checker, "each board reached (none is reserved)")
    checker.set_defaults(standalone=cmd_check)
    run = sub.add_parser("run", help="run, time and compare one model on every matching device in parallel")
    add_source_options(run)
    add_labgrid_options(run, "each reserved and locked through labgrid for its run")
    run.add_argument(
        "--priority",
        type=float,
        default=0.0,
        metavar="P",
        help="labgrid's reservation priority: a higher one is served before those waiting (default 0)",
    )
    run.add_argument("model", help="model file the devices load (.rknn on boards, .onnx on the host runtime)")
    run.add_argument(
        "--input", action="append", required=True, help=".npy file, one per model input, in order"
    )
    run.add_argument(
        "--reference",
        default="host",
        help="'host' (the host runtime, in a private daemon) or 'device:NAME' (a golden farm device)",
    )
    run.add_argument("--reference-model", type=Path, help="model the host reference runs (default: MODEL)")
    run.add_argument("--concurrency", type=int, default=4, help="devices running at once")
    run.add_argument("--threshold", type=float, default=0.99, help="lowest cosine similarity that agrees")
    run.add_argument("--warmup", type=_count, default=2, metavar="N", help="untimed runs before timing")
    run.add_argument(
        "--runs", type=_count, default=10, metavar="N", help="timed runs per device (the latency's spread)"
    )
    run.add_argument(
        "--reserve-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="wait S s for a device reserved by someone else (an unreachable one fails at once)",
    )
    run.add_argument("--json", type=Path, help="write the JSON report here")
    run.add_argument("--html", type=Path, help="write the HTML report (with charts) here")
    run.add_argument(
        "--quiet",
        action="store_true",
        help="no per-device progress on stderr (a bar per device on a terminal)",
    )
    run.set_defaults(standalone=cmd_run)
