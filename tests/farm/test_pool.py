"""Reservations through real daemons: selection, exclusivity, FIFO, expiry of a killed holder,
unhealthy devices skipped and probed again."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demo.daemon_process import DaemonProcess, start_daemon
from rknn_client.api import connect
from rknn_client.errors import FailedPrecondition
from rknn_client.farm import AcquireTimeout, DeviceEntry, Farm, Lease, NoMatchingDevice, parse_address
from rknn_client.farm.probe import probe
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


def test_unhealthy_devices_are_skipped_and_probed_again(tmp_path: Path, boards: list[DaemonProcess]) -> None:
    port = free_port()
    dead = f"tcp://127.0.0.1:{port}"
    farm = Farm.from_sources(None, [dead, boards[1].url], reprobe_s=0.2, probe_timeout_s=1.0)
    statuses = farm.statuses()
    assert [s.healthy for s in statuses] == [False, True]
    with farm.acquire(timeout=30) as device:  # the dead one is skipped
        assert device.info().soc == SOCS[1]
    late: list[Lease] = []
    waiter = threading.Thread(target=lambda: late.append(farm.acquire(soc="rk3399", timeout=120)))
    waiter.start()  # only the dead address could be an rk3399: it waits for it to come up
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
