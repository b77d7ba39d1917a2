"""Rockchip's rknn_server (aarch64) under qemu-aarch64-static, run inside `unshare -m -n`.

Run as `unshare -m -n python -m tools.legacy_compare.real_server ...` (see `RealServer`): in that
private network namespace its abstract `@transfer_proxy` cannot collide with the one the toolkit's
`adb forward` binds on this machine, and in that private mount namespace the stand-in librknnrt is
laid over /usr/lib (an overlay), where its `dlopen` and its `strings /usr/lib/librknnrt.so|grep`
version check look. qemu is started through a symlink named `rknn_server`, so the process's comm is
what the toolkit's `ps -A|grep rknn_server` looks for. The recording relay runs in here too (only
here can it reach `@transfer_proxy`); its path socket is reachable from outside. Prints
`READY <pid>` once serving and stops everything when its stdin closes.
"""

from __future__ import annotations

import argparse
import os
import pty
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools.legacy_compare.relay import RecordingRelay, connect_to

SERVER_SOCKET = "@transfer_proxy"
START_TIMEOUT_S = 60.0
SYSROOT = (
    "/usr/aarch64-linux-gnu"  # Debian's arm64 cross libraries (libc6-arm64-cross, libstdc++6-arm64-cross)
)


def overlay_usr_lib(stub_dir: Path) -> None:
    """/usr/lib with the stand-in's folder on top, in this mount namespace only."""
    options = f"lowerdir={stub_dir}:/usr/lib"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, "/usr/lib"], check=True)


def wait_listening(process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rknn_server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            connect_to(SERVER_SOCKET).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"rknn_server did not listen on {SERVER_SOCKET} within {START_TIMEOUT_S:.0f} s")


def _copy(leader: int, log: Path) -> None:
    with log.open("wb") as out:
        while True:
            try:
                data = os.read(leader, 1 << 16)
            except OSError:  # the server is gone
                return
            if not data:
                return
            out.write(data)
            out.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", type=Path, required=True, help="the aarch64 rknn_server binary")
    parser.add_argument(
        "--stub-dir", type=Path, required=True, help="folder holding the aarch64 librknnrt.so"
    )
    parser.add_argument("--listen", type=Path, required=True, help="the relay's path socket")
    parser.add_argument("--transcript", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    overlay_usr_lib(args.stub_dir)
    link = args.work / "rknn_server"
    link.unlink(missing_ok=True)
    qemu = shutil.which("qemu-aarch64-static")
    if qemu is None:
        raise SystemExit("qemu-aarch64-static is not installed (Debian: qemu-user-static)")
    link.symlink_to(qemu)
    log = args.work / "real-server.log"
    env = {**os.environ, "RKNN_SERVER_LOGLEVEL": "5", "TRANSFER_LOG_LEVEL": "5"}
    # On a terminal its stdout is line-buffered: every line reaches the log, even when it is stopped.
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(link), "-L", SYSROOT, str(args.server)], stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    threading.Thread(target=_copy, args=(leader, log), daemon=True).start()
    relay = None
    try:
        wait_listening(process, log)
        relay = RecordingRelay(args.listen, SERVER_SOCKET, args.transcript)
        print(f"READY {process.pid}", flush=True)
        sys.stdin.read()  # until the harness closes it
    finally:
        if relay is not None:
            relay.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
