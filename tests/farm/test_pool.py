"""Reservations through real daemons: selection, exclusivity, FIFO, expiry of a killed holder,
unreachable devices skipped at once (and taken when they come up while waiting)."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer

from rknn_client.device import connect
from rknn_client.errors import FailedPrecondition, VersionMismatch
from rknn_client.farm import (
    AcquireTimeout,
    DeviceEntry,
    Farm,
    Lease,
    NoMatchingDevice,
    NoReachableDevice,
    parse_address,
)
from rknn_client.farm.auth import DeviceAuth
from rknn_client.farm.probe import probe
from rknn_client.transport.security import ENV_TOKEN
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import PROTOCOL_VERSION
from rknn_server.testing import DaemonProcess, start_daemon
from tests.conftest import DaemonFactory
from tests.farm.conftest import SOCS


def farm_of(boards: list[DaemonProcess], **options: Any) -> Farm:
    return Farm.from_sources(None, [b.url for b in boards], **options)


def wait_until(predicate: Callable[[], bool], what: str, attempts: int = 600) -> None:
    """Poll (cheap GetInfo calls) until `predicate` holds; fails with `what` if it never does."""
    event = threading.Event()
    for _ in range(attempts):
        if predicate():
            return
        event.wait(0.05)
    raise AssertionError(f"never happened: {what}")


def test_acquire_by_soc_and_labels(farm_file: Path, boards: list[DaemonProcess]) -> None:
    farm = Farm.from_file(farm_file)
    with farm.acquire(soc="rk3566", timeout=30) as device:
        assert device.info().soc == "rk3566"
    lease = farm.acquire(labels={"rack": "r0"}, soc="rv1106", timeout=30)
    with lease:
        assert lease.entry.name == "b2"
    with pytest.raises(NoMatchingDevice, match="rk9999"):
        farm.acquire(soc="rk9999", timeout=30)
    with pytest.raises(NoMatchingDevice, match="no device of the farm matches"):
        farm.acquire(labels={"rack": "r9"}, timeout=30)


def test_reserved_device_refuses_other_sessions(boards: list[DaemonProcess], cnn_model: Path) -> None:
    board = boards[0]
    farm = farm_of([board], holder="ci-job-7")
    with farm.acquire(timeout=30) as device, connect(board.url) as other:
        digest = other.upload(cnn_model).digest
        with pytest.raises(FailedPrecondition, match=r"reserved by ci-job-7 since \d{4}-") as refused:
            other.open_session(digest)
        assert "FAILED_PRECONDITION" in str(refused.value)
        with device.load(cnn_model) as session:  # the holder's calls carry the reservation
            assert session.outputs[0].shape == (1, 10)
        assert probe(farm.entries[0]).reserved_by == "ci-job-7"
    assert probe(farm.entries[0]).reserved_by == ""
    with connect(board.url) as other, other.open_session(digest):
        pass


def queued_exactly(entry: DeviceEntry, count: int) -> bool:
    return probe(entry).reservation_waiters == count


def test_waiters_get_the_device_first_come_first_served(boards: list[DaemonProcess]) -> None:
    entry = parse_address(boards[0].url)[0]
    farm = Farm([entry])
    first = farm.acquire(timeout=30, holder="first")
    order: list[str] = []
    errors: list[BaseException] = []

    def take_turn(name: str) -> None:
        try:
            lease = farm.acquire(timeout=120, holder=name)
            order.append(name)
            lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = []
    for name in ("second", "third", "fourth"):
        threads.append(threading.Thread(target=take_turn, args=(name,)))
        threads[-1].start()
        wait_until(functools.partial(queued_exactly, entry, len(threads)), f"{len(threads)} waiter(s) queued")
    first.release()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert order == ["second", "third", "fourth"]


HOLDER_SCRIPT = """
import sys, threading
from rknn_client.farm import Farm, parse_address
lease = Farm(parse_address(sys.argv[1]), ttl_s=1.0).acquire(timeout=30, holder="doomed-holder")
print("held", flush=True)
threading.Event().wait()
"""


def test_a_killed_holder_loses_the_device_after_its_ttl(boards: list[DaemonProcess], tmp_path: Path) -> None:
    board = boards[0]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, board.url],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        entry = parse_address(board.url)[0]
        assert probe(entry).reserved_by == "doomed-holder"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        with Farm([entry]).acquire(timeout=60, holder="survivor") as device:
            assert probe(entry).reserved_by == "survivor"
            assert device.info().soc == SOCS[0]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_renewal_keeps_a_short_reservation(boards: list[DaemonProcess]) -> None:
    farm = farm_of([boards[0]], ttl_s=0.5, holder="keeper")
    with farm.acquire(timeout=30) as device:
        threading.Event().wait(2.0)  # four TTLs: only the renewals keep it
        assert probe(farm.entries[0]).reserved_by == "keeper"
        device.info(refresh=True)


def test_timeout_names_the_holder_and_leaves_the_queue(boards: list[DaemonProcess]) -> None:
    farm = farm_of([boards[0]])
    with farm.acquire(timeout=30, holder="hog"):
        with pytest.raises(AcquireTimeout, match="reserved by hog"):
            farm.acquire(timeout=1.0, holder="impatient")
        wait_until(lambda: probe(farm.entries[0]).reservation_waiters == 0, "the queue emptied")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_devices_are_skipped_at_once(boards: list[DaemonProcess]) -> None:
    dead = f"tcp://127.0.0.1:{free_port()}"
    farm = Farm.from_sources(None, [dead, boards[1].url])
    assert [s.healthy for s in farm.statuses()] == [False, True]
    started = time.monotonic()
    with farm.acquire(timeout=300) as device:  # the dead one is skipped, not waited for
        assert device.info().soc == SOCS[1]
    with pytest.raises(NoReachableDevice, match=r"127\.0\.0\.1:\d+: unreachable: .*not reachable"):
        farm.acquire(soc="rk3399", timeout=300)  # only the dead address could be an rk3399
    with pytest.raises(NoReachableDevice, match=r"no-such-board\.invalid"):
        Farm.from_sources(None, ["tcp://no-such-board.invalid:50515"]).acquire(timeout=300)
    assert time.monotonic() - started < 30


class _SickDaemon(rknn_pb2_grpc.RknnServerServicer):
    """A peer that answers GetInfo from a future protocol only this test speaks."""

    def GetInfo(
        self, request: rknn_pb2.GetInfoRequest, context: grpc.ServicerContext
    ) -> rknn_pb2.GetInfoResponse:
        return rknn_pb2.GetInfoResponse(
            daemon_version="99.0",
            protocol_version=PROTOCOL_VERSION + 5,
            min_client_protocol_version=PROTOCOL_VERSION + 1,
        )


@pytest.fixture
def sick_peers() -> Iterator[tuple[str, str]]:
    """Two in-process gRPC servers: one whose health is NOT_SERVING, one of a newer protocol."""
    servers, urls = [], []
    for serving in (False, True):
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        health = HealthServicer()
        health.set(
            "",
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        rknn_pb2_grpc.add_RknnServerServicer_to_server(_SickDaemon(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        urls.append(f"tcp://127.0.0.1:{port}")
    yield urls[0], urls[1]
    for server in servers:
        server.stop(None)


def test_not_serving_and_protocol_mismatch_are_unreachable(
    sick_peers: tuple[str, str], boards: list[DaemonProcess]
) -> None:
    not_serving, newer = sick_peers
    farm = Farm.from_sources(None, [not_serving, newer])
    started = time.monotonic()
    with pytest.raises(NoReachableDevice) as refused:
        farm.acquire(timeout=300)
    assert time.monotonic() - started < 30
    assert "reports health NOT_SERVING" in str(refused.value)
    assert "needs clients >= " in str(refused.value)
    with Farm.from_sources(None, [not_serving, newer, boards[0].url]).acquire(timeout=300) as device:
        assert device.info().soc == SOCS[0]


def test_a_device_coming_up_while_waiting_is_taken(tmp_path: Path, boards: list[DaemonProcess]) -> None:
    port = free_port()
    dead = f"tcp://127.0.0.1:{port}"
    farm = Farm.from_sources(None, [dead, boards[1].url], reprobe_s=0.2, probe_timeout_s=1.0)
    late: list[Lease] = []
    with farm.acquire(timeout=30, holder="hog"):
        # The live board is reserved, so it waits there, probing the dead address again meanwhile.
        waiter = threading.Thread(target=lambda: late.append(farm.acquire(timeout=120)))
        waiter.start()
        wait_until(lambda: probe(farm.entries[1]).reservation_waiters == 1, "queued on the live board")
        revived = start_daemon(
            tmp_path / "revived-cache",
            tmp_path / "revived.log",
            ["--runtime", "host", "--soc", "rk3399", "--listen", dead],
            listen_tcp=False,
        )
        try:
            waiter.join(120)
            assert [lease.entry.name for lease in late] == [f"127.0.0.1:{port}"]
        finally:
            for lease in late:
                lease.release()
            revived.stop()


def test_a_waiter_queued_everywhere_keeps_one_device_and_frees_the_rest(boards: list[DaemonProcess]) -> None:
    farm = farm_of(boards, ttl_s=600.0)  # a grant leaked by the withdrawal would stay for minutes
    held = [farm.acquire(timeout=30, holder=f"h{i}") for i in range(3)]
    assert sorted(lease.entry.name for lease in held) == sorted(e.name for e in farm.entries)
    got: list[Lease] = []
    waiter = threading.Thread(target=lambda: got.append(farm.acquire(timeout=120, holder="waiter")))
    waiter.start()
    wait_until(lambda: sum(s.reservation_waiters for s in farm.statuses()) == 3, "queued on every board")
    for lease in held:
        lease.release()
    waiter.join(120)
    (lease,) = got
    with lease:
        others = [e for e in farm.entries if e.name != lease.entry.name]
        wait_until(
            lambda: all(s.reserved_by == "" and s.reservation_waiters == 0 for s in farm.statuses(others)),
            "the other boards are free again",
        )
        assert probe(lease.entry).reserved_by == "waiter"


def test_a_board_with_a_token_file_takes_the_farm_files_token_over_the_variable(
    make_daemon: DaemonFactory, tmp_path: Path, cnn_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "board.token"
    token_file.write_text("s3cret-farm-board\n")
    token_file.chmod(0o600)
    board = make_daemon("--soc", "rk3588", "--auth-token-file", str(token_file), name="locked")
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    refused = probe(DeviceEntry("bare", board.url))
    assert not refused.healthy and "UNAUTHENTICATED" in refused.error
    # The farm file names this board's token; the variable holds another daemon's.
    monkeypatch.setenv(ENV_TOKEN, "another-daemons-token")
    keyed = DeviceEntry("keyed", board.url, auth=DeviceAuth(token_file=token_file))
    assert probe(keyed).healthy
    with Farm([keyed], holder="keyed-job").acquire(timeout=30) as device, device.load(cnn_model) as session:
        assert session.outputs[0].shape == (1, 10)
        assert probe(keyed).reserved_by == "keyed-job"


def test_every_call_of_a_device_is_made_after_the_version_check(sick_peers: tuple[str, str]) -> None:
    """A daemon needing newer clients is refused with the one VersionMismatch message whatever the
    first call is (a Reserve used to reach it and come back as a bare UNIMPLEMENTED)."""
    _, newer = sick_peers
    for call in (
        lambda device: device.reserve("job", 30.0),
        lambda device: device.queue_reservation("job", 30.0, wait_s=1.0),
        lambda device: device.release_reservation("no-such-token"),
    ):
        with connect(newer) as device, pytest.raises(VersionMismatch, match="needs clients >= "):
            call(device)
