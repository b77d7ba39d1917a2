"""Another local user holding many idle connections to a daemon's door (the attacks of security
findings 4 and 5): a child process run as `nobody`, which connects and then sends nothing.

The child (the system's python, stdlib only: the test's venv may be unreadable to that user) reports,
on each line the parent sends, how many of its connections (of those open for over a second) the
daemon still holds open (neither closed nor answered); with `replace`, it opens a new one for each the daemon let go, as an attacker
keeping up the pressure would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

NOBODY = 65534
_CHILD = r"""
import errno, select, socket, sys, time
kind, address, count, replace = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

def connect():
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + address)
    else:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
    sock.setblocking(False)
    born[sock] = time.monotonic()
    return sock

def held(sock):
    try:
        sock.recv(1, socket.MSG_PEEK)
        return False  # closed (b"") or answered (a refusal): let go
    except BlockingIOError:
        return True
    except OSError:
        return False

born = {}
socks = [connect() for _ in range(count)]
print("ready", flush=True)
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.05)
    if ready:
        if not sys.stdin.readline():
            break
        settled = [s for s in socks if time.monotonic() - born[s] > 1.0]  # not just connected
        print(sum(held(s) for s in settled), flush=True)
    if replace:
        for i, sock in enumerate(socks):
            if not held(sock):
                sock.close()
                born.pop(sock, None)
                try:
                    socks[i] = connect()
                except OSError:
                    socks[i] = sock
"""


class Hoarder:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def held(self) -> int:
        """How many of its connections the daemon holds open now."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def settle(self, expected: int, timeout: float = 60.0) -> int:
        """How many the daemon holds once that is `expected` (or at the deadline)."""
        deadline = time.monotonic() + timeout
        while (held := self.held()) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        return held


@contextmanager
def hoarding(kind: str, address: str, count: int, replace: bool = False) -> Iterator[Hoarder]:
    """`count` idle connections held by uid 65534 to a unix-abstract NAME or a tcp HOST:PORT."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root (to run the other user's client) and a system python3")
    process = subprocess.Popen(
        [python, "-I", "-c", _CHILD, kind, address, str(count), "1" if replace else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready", "the hoarder could not connect"
        yield Hoarder(process)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
