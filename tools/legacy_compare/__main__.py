"""`python -m tools.legacy_compare`: the same toolkit sessions against Rockchip's rknn_server (under
qemu) and against ours, then every difference of their transcripts not on allow.toml (README.md).

Run as root (namespaces, the overlay mount). The whole run happens in a private network namespace
of its own, so the `@transfer_proxy` the toolkit's adb forward binds meets no other toolkit's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rknn_client.user_cache import cache_root
from tests.adb.fixtures import EmulatedBoard, PrivateAdbServer
from tests.adb.services import DeviceProfile
from tests.legacy.conftest import RESTARTS_LOG, ps_showing, recording
from tests.legacy.toolkit import Toolkit, find_toolkit
from tools.legacy_compare.decode import read_transcript
from tools.legacy_compare.differ import (
    Difference,
    allowance_for,
    compare_messages,
    compare_results,
    load_allow_list,
)
from tools.legacy_compare.sessions import SESSIONS, Session, models, run_session
from tools.legacy_compare.stand_in import aarch64_stand_in, host_stand_in
from tools.legacy_compare.targets import Target, our_daemon, real_server

DEFAULT_SERVER = cache_root() / "real-server" / "rknn_server"
INSIDE = "RKNN_LEGACY_COMPARE_NETNS"
SETTLE_S = 0.5  # for the relay's last lines after the toolkit exits


def _in_own_network_namespace(argv: list[str]) -> int:
    script = 'ip link set lo up && exec "$@"'
    command = ["unshare", "-n", "sh", "-c", script, "sh", sys.executable, "-m", "tools.legacy_compare", *argv]
    return subprocess.run(command, env={**os.environ, INSIDE: "1"}).returncode


def _drive(
    target: Target,
    toolkit: Toolkit,
    adb: PrivateAdbServer,
    files: dict[str, Path],
    sessions: list[Session],
    work: Path,
) -> dict[str, tuple[dict[str, Any], int, int]]:
    """Each session's results and its slice of the target's transcript (line numbers)."""
    profile = DeviceProfile(
        target.board,
        serial_name=f"compare-{target.name}",
        commands={
            "ps": ps_showing(target.pid),
            "killall": recording("killall", target.board),
            "nohup": recording("nohup", target.board),
        },
    )
    board = EmulatedBoard(adb, profile)
    done: dict[str, tuple[dict[str, Any], int, int]] = {}
    try:
        for session in sessions:
            start = _lines(target.transcript)
            result = run_session(
                toolkit, adb, board.serial, session, files[session.model], work / session.name
            )
            time.sleep(SETTLE_S)
            done[session.name] = (result, start, _lines(target.transcript))
            print(f"  {target.name} {session.name}: {_summary(result)}", flush=True)
    finally:
        board.close()
    return done


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _summary(result: dict[str, Any]) -> str:
    steps = ("load_rknn", "init_runtime", "inference", "eval_memory")
    return (
        ", ".join(f"{step}={str(result.get(step, '-'))[:40]}" for step in steps)
        if "failed" not in result
        else result["failed"]
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tools.legacy_compare", description=__doc__)
    parser.add_argument(
        "--server",
        type=Path,
        default=DEFAULT_SERVER,
        help=f"the aarch64 rknn_server (default {DEFAULT_SERVER})",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/legacy-compare"))
    parser.add_argument("--session", action="append", help="only these sessions (repeatable)")
    parser.add_argument("--toolkit-version", help="the installed toolkit to drive (default: 2.5.0)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: it needs namespaces and an overlay mount")
    if not args.server.exists():
        parser.error(
            f"no real server at {args.server} (see tools/legacy_compare/README.md for where to get it)"
        )
    if os.environ.get(INSIDE) != "1":
        return _in_own_network_namespace(argv)
    toolkit = find_toolkit(args.toolkit_version)
    if toolkit is None:
        parser.error("no RKNN-Toolkit2 venv (rknn-client toolkit install --torch-stub)")
    sessions = [s for s in SESSIONS if not args.session or s.name in args.session]
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    # The models from the default toolkit's converter: 2.3.2's venv cannot convert (its onnx has no
    # onnx.mapping), and the .rknn is the same input to both servers whichever toolkit drives them.
    files = models(find_toolkit() or toolkit, work)
    host_stub = host_stand_in(work / "stub-host")
    aarch64_stub = aarch64_stand_in(work / "stub-aarch64")
    adb = PrivateAdbServer(str(toolkit.adb), work / "adb-home")
    adb.start()
    runs: dict[str, dict[str, tuple[dict[str, Any], int, int]]] = {}
    targets: dict[str, Callable[[], AbstractContextManager[Target]]] = {
        "real": lambda: real_server(args.server, aarch64_stub.parent, work / "real"),
        "ours": lambda: our_daemon(host_stub, work / "ours"),
    }
    transcripts: dict[str, Path] = {}
    restarts: dict[str, str] = {}
    try:
        for name, start in targets.items():
            print(f"{name}:", flush=True)
            with start() as target:
                runs[name] = _drive(target, toolkit, adb, files, sessions, work / name / "sessions")
                transcripts[name] = target.transcript
                log = target.board / RESTARTS_LOG
                restarts[name] = log.read_text() if log.exists() else ""
    finally:
        adb.stop()
    return report(sessions, runs, transcripts, restarts)


def _grouped(difference: Difference) -> str:
    """The difference without its message index: the same one in every RUN of a session is one line."""
    where = difference.where.split("#", 1)[0]
    return str(Difference(difference.session, where, difference.key, difference.real, difference.ours))


def report(
    sessions: list[Session],
    runs: dict[str, dict[str, tuple[dict[str, Any], int, int]]],
    transcripts: dict[str, Path],
    restarts: dict[str, str],
) -> int:
    allowed = load_allow_list()
    found: list[Difference] = []
    for session in sessions:
        real, r0, r1 = runs["real"][session.name]
        ours, o0, o1 = runs["ours"][session.name]
        found += compare_messages(
            session.name,
            read_transcript(transcripts["real"], r0, r1),
            read_transcript(transcripts["ours"], o0, o1),
        )
        found += compare_results(session.name, real, ours)
    unexplained = [d for d in found if allowance_for(d, allowed) is None]
    print(
        f"\n{len(found)} differences, {len(found) - len(unexplained)} allowed (allow.toml), {len(unexplained)} not:"
    )
    by_entry = Counter(entry.key for d in found if (entry := allowance_for(d, allowed)) is not None)
    print("  allowed: " + ", ".join(f"{key} x{count}" for key, count in sorted(by_entry.items())))
    for line, count in Counter(_grouped(d) for d in unexplained).items():
        print(f"  {line}" + (f"  (x{count})" if count > 1 else ""))
    for name, text in restarts.items():
        if text:
            print(f"{name}: the toolkit ran restart commands on the board: {text.strip()}")
    timing: dict[str, list[float]] = {
        name: runs[name].get("timing", ({}, 0, 0))[0].get("inference_seconds") or [] for name in runs
    }
    if all(timing.values()):
        p50 = {name: round(statistics.median(seconds) * 1e3, 2) for name, seconds in timing.items()}
        print(f"timing p50 per inference (ms): {json.dumps(p50)}, ours/real {p50['ours'] / p50['real']:.2f}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
