"""The toolkit (legacy) listener against a live daemon under the attacks of security findings 3 and 4:
a LOAD bomb, another user hoarding connections, and connections left idle."""

from __future__ import annotations

import resource
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rknn_server.testing import DaemonProcess
from tests.deadlines import assert_waited
from tests.legacy.wire_client import (
    ACK_FAIL,
    HEADER,
    LOAD,
    LOAD_ACK,
    VERSION,
    VERSION_ACK,
    WireClient,
    header,
)
from tests.reliability.conftest import StartDaemon, info
from tests.reliability.hoarder import hoarding

GIB = 1 << 30
TRAILING = 132  # the zero bytes the toolkit sends after the model


class Toolkit:
    """A daemon serving the toolkit protocol on a private abstract socket."""

    def __init__(self, daemons: StartDaemon, *args: str) -> None:
        self.name = f"rknn-attack-{uuid.uuid4().hex[:12]}"
        self.daemon = daemons("--legacy-listen", f"unix-abstract:{self.name}", *args)

    def client(self, timeout: float = 60.0) -> WireClient:
        client = WireClient("\0" + self.name, timeout)
        assert client.open() == 0
        return client


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_for_log(daemon: DaemonProcess, text: str, timeout_s: float = 20.0) -> str:
    """The daemon's log line holding `text`, once it is written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in daemon.log_path.read_text(errors="replace").splitlines():
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"the daemon logged no line with {text!r} within {timeout_s:g} s")


def send_load_head(client: WireClient, size: int) -> None:
    """A LOAD's frame length, header and model size: everything but the model itself."""
    length = HEADER + 4 + size + TRAILING
    client.sock.sendall(struct.pack("<I", length) + header(LOAD, 1, length) + struct.pack("<I", size))


@contextmanager
def soft_open_files(limit: int) -> Iterator[None]:
    """The default soft RLIMIT_NOFILE of a service (1024) for the daemons started meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_load_over_the_memory_budget_is_refused_before_its_body_is_sent(daemons: StartDaemon) -> None:
    toolkit = Toolkit(daemons, "--max-session-memory", "2GiB")
    client = toolkit.client(timeout=30)
    send_load_head(client, 3 * GIB)  # and not a byte of the 3 GiB
    # Refused as Rockchip's server refuses a model (ACK_FAIL: the toolkit's RKNN_ERR_MODEL_INVALID),
    # with no crash report (the toolkit would kill the daemon); the reason is in the daemon's log.
    load = client.reply()
    assert (load.command, load.ack, load.is_crash) == (LOAD_ACK, ACK_FAIL, False)
    logged = wait_for_log(toolkit.daemon, "--max-session-memory")
    assert "max_session_memory_bytes" in logged, logged
    assert toolkit.client().call(VERSION).command == VERSION_ACK


def test_a_1_gib_load_streams_to_the_cache_in_bounded_memory(daemons: StartDaemon, tmp_path: Path) -> None:
    toolkit = Toolkit(daemons, "--max-model-bytes", "2GiB")
    pid = toolkit.daemon.pid
    client = toolkit.client(timeout=120)
    assert client.call(VERSION).command == VERSION_ACK
    baseline, peak = rss_bytes(pid), [0]
    sending = threading.Event()

    def sample() -> None:
        while not sending.wait(0.05):
            peak[0] = max(peak[0], rss_bytes(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        send_load_head(client, GIB)
        zeros = bytes(4 << 20)
        for _ in range(GIB // len(zeros)):
            client.sock.sendall(zeros)
        client.sock.sendall(bytes(TRAILING))
        reply = client.reply()  # not a model the runtime opens, but the daemon took it whole
    finally:
        sending.set()
        sampler.join()
    growth = max(peak[0], rss_bytes(pid)) - baseline
    assert growth < 64 << 20, f"daemon RSS grew by {growth >> 20} MiB while it received a 1 GiB model"
    # Zeros are no model the runtime opens (ACK_FAIL), but the daemon took them whole: no limit refused them.
    assert (reply.command, reply.ack) == (LOAD_ACK, ACK_FAIL)
    assert "--max-model-bytes" not in toolkit.daemon.log_path.read_text(errors="replace")
    assert toolkit.client().call(VERSION).command == VERSION_ACK
    print(f"RSS {baseline >> 20} MiB -> peak {peak[0] >> 20} MiB while a 1 GiB LOAD streamed")
    toolkit.daemon.stop()
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)  # the daemons fixture's cache: 1 GiB


def getinfo_latency(daemon: DaemonProcess, calls: int = 5) -> float:
    """The slowest of a few GetInfo calls of another client, each over a fresh connection."""
    slowest = 0.0
    for _ in range(calls):
        start = time.monotonic()
        info(daemon)
        slowest = max(slowest, time.monotonic() - start)
    return slowest


def test_another_user_holding_1100_connections_shuts_out_neither_grpc_nor_others(
    daemons: StartDaemon,
) -> None:
    with soft_open_files(1024):  # what a service gets unless its unit says otherwise
        toolkit = Toolkit(daemons)
    with hoarding("unix", toolkit.name, 1100) as hoarder:
        assert hoarder.settle(16) == 16  # --max-toolkit-connections-per-client, the rest closed unread
        slowest = getinfo_latency(toolkit.daemon)
        assert slowest < 2.0, f"GetInfo took {slowest:.2f} s with 1100 toolkit connections held"
        assert toolkit.client().call(VERSION).command == VERSION_ACK  # another user (root) is served
    print(f"GetInfo under 1100 toolkit connections: slowest of 5 {slowest * 1000:.1f} ms")


def test_an_idle_connection_is_closed_after_the_idle_timeout(daemons: StartDaemon) -> None:
    toolkit = Toolkit(daemons, "--toolkit-idle-timeout", "1")
    idle, busy = toolkit.client(timeout=30), toolkit.client(timeout=30)
    started = time.monotonic()
    while time.monotonic() - started < 2.5:  # one that keeps talking is kept
        assert busy.call(VERSION).command == VERSION_ACK
        time.sleep(0.25)
    assert idle.sock.recv(1) == b""  # closed by the daemon (a recv timeout would raise)
    assert_waited(started, 1.0, 25)
    assert busy.call(VERSION).command == VERSION_ACK


@pytest.mark.parametrize("cut", ["in the header", "in the body"])
def test_a_message_cut_short_then_silence_is_closed_after_the_idle_timeout(
    daemons: StartDaemon, cut: str
) -> None:
    """Bytes already received are read without waiting; a read that must wait for the rest of the
    message is still bounded by the idle deadline."""
    toolkit = Toolkit(daemons, "--toolkit-idle-timeout", "1")
    client = toolkit.client(timeout=30)
    size = HEADER + 16
    message = struct.pack("<I", size) + header(VERSION, 1, size) + bytes(16)
    started = time.monotonic()
    client.sock.sendall(message[: 4 + HEADER // 2] if cut == "in the header" else message[:-8])
    assert client.sock.recv(1) == b""  # closed by the daemon (a recv timeout would raise)
    assert_waited(started, 1.0, 25)
    assert toolkit.client().call(VERSION).command == VERSION_ACK


@pytest.mark.parametrize("size", [0x6D])
def test_a_load_too_short_to_hold_its_model_size_is_refused(daemons: StartDaemon, size: int) -> None:
    toolkit = Toolkit(daemons)
    client = toolkit.client(timeout=30)
    client.sock.sendall(struct.pack("<I", size) + header(LOAD, 1, size) + b"\0")
    # A malformed frame ends that connection (no crash report), logged with its reason.
    assert client.sock.recv(1) == b""
    assert "the model size follows its header" in wait_for_log(toolkit.daemon, "the model size follows")
    assert toolkit.client().call(VERSION).command == VERSION_ACK
