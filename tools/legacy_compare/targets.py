"""The two servers compared, each behind its recording relay on `<board>/dev/socket/transfer_proxy`.

`real_server` runs Rockchip's binary in its namespaces (real_server.py) and `our_daemon` runs
rknn_server on the stand-in librknnrt with its legacy listener on a path socket beside the relay's.
Both yield a `Target`: the PID `ps` must show as rknn_server, the board root the emulated adbd
serves, and the transcript the relay writes. Both stop what they started, by PID.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rknn_server.testing import start_daemon
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt_cases import rknnrt_args
from tools.legacy_compare.relay import RecordingRelay

ROOT = Path(__file__).resolve().parents[2]
BOARD_SOCKET = "dev/socket/transfer_proxy"


@dataclass(frozen=True)
class Target:
    name: str
    pid: int
    board: Path
    transcript: Path


@contextmanager
def real_server(binary: Path, stub_dir: Path, work: Path) -> Iterator[Target]:
    work.mkdir(parents=True, exist_ok=True)
    board = rk3588_board(work / "board")
    transcript = work / "transcript.jsonl"
    transcript.unlink(missing_ok=True)
    command = [
        "unshare", "-m", "-n", sys.executable, "-m", "tools.legacy_compare.real_server",
        "--server", str(binary), "--stub-dir", str(stub_dir), "--listen", str(board / BOARD_SOCKET),
        "--transcript", str(transcript), "--work", str(work),
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the real server did not start: {line!r} (see {work / 'real-server.log'})")
        yield Target("real", int(line.split()[1]), board, transcript)
    finally:
        process.stdin.close()  # it stops qemu and its relay itself
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def our_daemon(stub: Path, work: Path) -> Iterator[Target]:
    board = rk3588_board(work / "board")
    transcript = work / "transcript.jsonl"
    transcript.unlink(missing_ok=True)
    ours = board / f"{BOARD_SOCKET}.oss"
    ours.parent.mkdir(parents=True, exist_ok=True)
    args = rknnrt_args(stub, board, "--legacy-listen", f"unix:{ours}", "--log-level", "debug")
    daemon = start_daemon(work / "cache", work / "daemon.log", args)
    relay = RecordingRelay(board / BOARD_SOCKET, str(ours), transcript)
    try:
        yield Target("ours", daemon.pid, board, transcript)
    finally:
        relay.close()
        daemon.stop()
