"""Another local user holding many idle connections to a daemon's door (the attacks of security
findings 4 and 5): child processes run as `nobody`, which connect and then send nothing.

Each child (the system's python, stdlib only: the test's venv may be unreadable to that user) reports,
on each line the parent sends, how many of its connections (of those open for over a second) the
daemon still holds open (neither closed nor answered); with `replace`, it opens a new one for each the daemon let go, as an attacker
keeping up the pressure would.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

NOBODY = 65534
_CHILD = r"""
import resource, select, socket, sys, time
kind, address, count, replace = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
# Room for the sockets whatever soft limit this user was started with (the parent sent no more
# than the hard limit allows).
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft != resource.RLIM_INFINITY and soft != hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

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
socks = []
try:
    while len(socks) < count:
        socks.append(connect())
except OSError as error:
    print(f"error: connection {len(socks) + 1} of {count} to {kind}:{address} failed: {error!r} "
          f"(RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)})", flush=True)
    sys.exit(1)
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


# Files a child needs besides its connections (its interpreter, stdio, the select set).
SPARE_FILES = 64


class Hoarder:
    """The other user's connections, held by one or more children (as many as the hard limit on
    open files needs: a CI runner's may be 1024): one user's connections all the same to the daemon."""

    def __init__(self, processes: list[subprocess.Popen[str]]) -> None:
        self.processes = processes

    def held(self) -> int:
        """How many of its connections the daemon holds open now."""
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("count\n")
            process.stdin.flush()
        return sum(int(_line(process)) for process in self.processes)

    def settle(self, expected: int, timeout: float = 60.0) -> int:
        """How many the daemon holds once that is `expected` (or at the deadline)."""
        deadline = time.monotonic() + timeout
        while (held := self.held()) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        return held


def _line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def _shares(count: int) -> list[int]:
    """`count` split into the connections each child may hold within the hard limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    most = count if hard == resource.RLIM_INFINITY else max(1, hard - SPARE_FILES)
    return [min(most, count - start) for start in range(0, count, most)]


@contextmanager
def hoarding(kind: str, address: str, count: int, replace: bool = False) -> Iterator[Hoarder]:
    """`count` idle connections held by uid 65534 to a unix-abstract NAME or a tcp HOST:PORT."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root (to run the other user's client) and a system python3")
    processes: list[subprocess.Popen[str]] = []
    try:
        for share in _shares(count):
            processes.append(
                subprocess.Popen(
                    [python, "-I", "-c", _CHILD, kind, address, str(share), "1" if replace else "0"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    user=NOBODY,
                    group=NOBODY,
                    extra_groups=[],
                )
            )
            if (first := _line(processes[-1])) != "ready":
                process = processes[-1]
                process.kill()
                assert process.stderr is not None
                raise AssertionError(
                    f"the hoarder could not connect: {first or 'no line'}"
                    f" (exit {process.wait()}, stderr: {process.stderr.read()[-2000:]!r})"
                )
        yield Hoarder(processes)
    finally:
        for process in processes:
            assert process.stdin is not None
            process.stdin.close()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
