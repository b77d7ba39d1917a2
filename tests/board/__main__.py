"""`make board-test`: build (or reuse) the emulated board images, then run tests/board against them.

    python -m tests.board [-k EXPRESSION] [BOARD ...]     BOARD: arm64 (default), armhf, bullseye

The binfmt_misc handlers stay registered for the whole run and are removed after it, even when it
fails or is stopped with SIGTERM. A machine that cannot run the boards (not root, no binfmt_misc, no
mmdebstrap, no PID namespace) or cannot reach PyPI or Debian's mirror gets one line saying why and exit 0.
Each image build has a deadline and each test a timeout, so a run always ends.

RKNN_BOARD_CACHE=DIR keeps the images in DIR instead of ~/.cache/rknn_client/board (an empty DIR shows
a cold run as a fresh CI machine sees it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from rknn_client import __version__
from tests.board.preflight import missing_prerequisites, unreachable
from tests.board.rootfs import BOARDS, CACHE, ROOT, binfmt_handler, ensure_rootfs

# What tests/board/conftest.py reads: the rootfs of each board, and the wheel built from the clone.
ENV_ROOTFS = "RKNN_BOARD_ROOTFS"
ENV_WHEEL = "RKNN_BOARD_WHEEL"
# Per test: a deploy under emulation takes about a minute on an idle machine; a hang ends here.
TEST_SECONDS = 900


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def project_wheel() -> Path:
    """The wheel `make wheel` built from this clone, for this version."""
    found = sorted((ROOT / "dist").glob(f"rknn_server_oss-{__version__}-*.whl"))
    if not found:
        raise SystemExit(f"board-test: no dist/rknn_server_oss-{__version__}-*.whl: run `make wheel` first")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.board",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # No argparse `choices`: with nargs="*" Python 3.11 checks the empty default against them and fails.
    parser.add_argument(
        "boards", nargs="*", metavar="BOARD", help=f"{', '.join(sorted(BOARDS))} (default: arm64)"
    )
    parser.add_argument("-k", dest="select", default="", help="only the tests pytest's -k EXPRESSION selects")
    args = parser.parse_args(argv)
    unknown = [name for name in args.boards if name not in BOARDS]
    if unknown:
        parser.error(f"unknown board {unknown[0]!r} (choose from {', '.join(sorted(BOARDS))})")
    specs = [BOARDS[name] for name in dict.fromkeys(args.boards or ["arm64"])]
    reason = missing_prerequisites(specs) or unreachable(specs)
    if reason:
        print(f"board-test SKIPPED: {reason}")
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    wheel = project_wheel()
    with contextlib.ExitStack() as stack:
        for qemu in dict.fromkeys(spec.qemu for spec in specs):
            stack.enter_context(binfmt_handler(qemu))
        rootfs: dict[str, str] = {}
        for spec in specs:
            started, log = time.monotonic(), CACHE / f"build-{spec.name}.log"
            path, built = ensure_rootfs(spec, log)
            what = f"built in {time.monotonic() - started:.0f} s (log {log})" if built else "cached"
            print(f"board-test: {spec.name} rootfs ({spec.suite} {spec.arch}) {what}: {path}", flush=True)
            rootfs[spec.name] = str(path)
        env = os.environ | {ENV_ROOTFS: json.dumps(rootfs), ENV_WHEEL: str(wheel)}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--timeout={TEST_SECONDS}",
            "tests/board",
            *(["-k", args.select] if args.select else []),
        ]
        return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
