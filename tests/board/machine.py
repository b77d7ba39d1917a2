"""A booted emulated board: a rootfs run in PID and mount namespaces of its own.

The board's first process (its init, the board's python3 under qemu) is PID 1 of a new PID namespace
and lives in a private mount namespace holding an overlay of the cached rootfs (writes go to a
throw-away upper folder) with its own /proc, /sys and /dev. So the board's processes see only each
other (the real toolkit's `killall rknn_server` cannot reach the host's), and every mount vanishes
with the namespace, whatever way the run ends. The init reaps orphans (`kill -0` on a dead daemon
must fail) and exits when its stdin closes, that is when this process dies; `unshare --kill-child`
ends it when unshare is killed. The network is the host's: the PC reaches the board on loopback.
The host reads and writes the board's files through /proc/INIT/root.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import psutil

BOARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# PID 1 of the board: reap every child (orphans come to it), exit at EOF on stdin.
_INIT = (
    "import os, signal, sys\n"
    "def reap(*_):\n"
    "    try:\n"
    "        while os.waitpid(-1, os.WNOHANG)[0]: pass\n"
    "    except ChildProcessError: pass\n"
    "signal.signal(signal.SIGCHLD, reap)\n"
    "print('board up', flush=True)\n"
    "sys.stdin.read()\n"
)
_BOOT_SECONDS = 120


class Board:
    """`with Board(rootfs) as board:` boots it; leaving stops every process on it and drops its mounts.
    With `writable`, the rootfs itself is the board's root (to build the cache); otherwise an overlay."""

    def __init__(self, rootfs: Path, writable: bool = False) -> None:
        self.rootfs = rootfs
        self.writable = writable
        self._work = Path(tempfile.mkdtemp(prefix="rknn-board-"))
        self._unshare: subprocess.Popen[str] | None = None
        self.init_pid = 0

    @property
    def root(self) -> Path:
        """The board's `/`, as this machine sees it."""
        return Path(f"/proc/{self.init_pid}/root")

    def path(self, board_path: str) -> Path:
        return self.root / board_path.lstrip("/")

    def __enter__(self) -> Board:
        merged = self._work / "root"
        merged.mkdir()
        if self.writable:
            mount = f"mount --bind {shlex.quote(str(self.rootfs))} {merged}"
        else:
            upper, work = self._work / "upper", self._work / "work"
            upper.mkdir()
            work.mkdir()
            options = f"lowerdir={self.rootfs},upperdir={upper},workdir={work}"
            mount = f"mount -t overlay overlay -o {shlex.quote(options)} {merged}"
        script = " && ".join(
            [
                mount,
                f"mount -t proc proc {merged}/proc",
                f"mount -t sysfs sysfs {merged}/sys",
                f"mount --rbind /dev {merged}/dev",
                f"cp /etc/resolv.conf {merged}/etc/resolv.conf",
                f"exec chroot {merged} /usr/bin/env -i PATH={BOARD_PATH} /usr/bin/python3 -c {shlex.quote(_INIT)}",
            ]
        )
        command = [
            "unshare",
            "--pid",
            "--kill-child",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            script,
        ]
        self._unshare = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self._unshare.stdout is not None
        try:
            line = self._unshare.stdout.readline()
            if line.strip() != "board up":
                raise RuntimeError(f"the board did not boot: {line}{self._unshare.stdout.read()[-2000:]}")
            children = psutil.Process(self._unshare.pid).children()
            self.init_pid = children[0].pid
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._unshare is not None:
            if self._unshare.stdin is not None:
                self._unshare.stdin.close()
            try:
                self._unshare.wait(30)
            except subprocess.TimeoutExpired:
                self._unshare.kill()
                self._unshare.wait()
            if self._unshare.stdout is not None:
                self._unshare.stdout.close()
        shutil.rmtree(self._work, ignore_errors=True)

    def command(self, script: str, env: dict[str, str] | None = None) -> list[str]:
        """The host command that runs `script` with the board's /bin/sh, inside the board, in a clean
        environment (the host's variables never leak in)."""
        variables = {"PATH": BOARD_PATH, "HOME": "/root", "LANG": "C.UTF-8"} | (env or {})
        return [
            "nsenter",
            "--target",
            str(self.init_pid),
            "--pid",
            "--mount",
            "--root",
            "--wd",
            "/usr/bin/env",
            "-i",
            *(f"{key}={value}" for key, value in variables.items()),
            "/bin/sh",
            "-c",
            script,
        ]

    def run(
        self, script: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `script` on the board; its output (stdout and stderr together) and exit code."""
        return subprocess.run(
            self.command(script, env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
