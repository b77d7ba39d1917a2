"""Farms scheduled by labgrid's coordinator: its places are the devices, its queue decides who waits.

A board's daemon is a labgrid resource of class RKNNDaemon (`address`, `port`) in an exporter's
configuration; a place that matches it, with tags (`soc=rk3588`), is one device. For each device
of a fan-out a place is reserved (a labgrid reservation filtered by the run's tags and the place's
name), waited for in the coordinator's queue and locked, then the daemon's own reservation is
taken as for any farm device (so a PC outside labgrid cannot skew the timing either); both are
given back after the device's run.

Labgrid is not imported here: labgrid_agent.py runs on the interpreter of `labgrid-client` (found
on PATH), one process per place held. That process also unlocks the place when this one dies, which
labgrid would not do by itself (a lock outlives its client until someone unlocks it).
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from rknn_client.api import Device
from rknn_client.errors import RknnError
from rknn_client.farm.inventory import DeviceEntry, FarmConfigError, parse_address, tcp_address
from rknn_client.farm.pool import CANCEL_GRACE_S, AcquireTimeout, Cancelled, Farm, Lease

RESOURCE_CLASS = "RKNNDaemon"
DEFAULT_COORDINATOR = "127.0.0.1:20408"  # labgrid's own default
AGENT = Path(__file__).with_name("labgrid_agent.py")
LIST_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0  # for an agent to cancel, unlock and exit once told to


class LabgridError(RknnError):
    """The coordinator refused or could not be reached (the message says which, as labgrid put it)."""


def coordinator_address(value: str | None) -> str:
    """HOST:PORT of the coordinator: the one given, else labgrid's LG_COORDINATOR, else its default."""
    return value or os.environ.get("LG_COORDINATOR") or DEFAULT_COORDINATOR


def labgrid_python() -> str:
    """The interpreter `labgrid-client` runs on (its #! line): where labgrid's packages are, whether
    labgrid came with pipx, a venv or the distribution."""
    client = shutil.which("labgrid-client")
    if client is None:
        raise FarmConfigError("labgrid-client is not on PATH: install labgrid (e.g. `pipx install labgrid`)")
    with open(client, encoding="utf-8", errors="replace") as script:
        lines = [script.readline(), script.readline()]
    if lines[0].startswith("#!/bin/sh") and lines[1].startswith("'''exec' "):
        return shlex.split(lines[1].removeprefix("'''exec' "))[0]  # pip's form for long paths
    if lines[0].startswith("#!"):
        return shlex.split(lines[0][2:])[0]
    raise FarmConfigError(f"{client} is not a Python script: cannot tell which Python has labgrid")


def _agent(python: str, *args: str) -> subprocess.Popen[str]:
    # Its own session: the Ctrl-C meant for this process (it cancels and gives back) must not reach it.
    # Isolated (-I): the folder of the script, ours, is not on its path.
    return subprocess.Popen(
        [python, "-I", str(AGENT), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _tag_args(tags: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in tags.items()]


def place_entries(python: str, coordinator: str, tags: Mapping[str, str]) -> list[DeviceEntry]:
    """One device per place whose tags match: named after the place, its tags as labels, the
    address of the one RKNNDaemon resource it matches (places without one are no RKNN boards)."""
    agent = _agent(python, "list", coordinator, RESOURCE_CLASS, *_tag_args(tags))
    try:
        out, _ = agent.communicate(timeout=LIST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
        raise LabgridError(
            f"the coordinator {coordinator} did not answer within {LIST_TIMEOUT_S:g} s"
        ) from None
    answer = json.loads(out or '{"error": "labgrid_agent.py ended without an answer"}')
    if isinstance(answer, dict):
        raise LabgridError(f"coordinator {coordinator}: {answer['error']}")
    entries = []
    for place in answer:
        resources = place["resources"]
        if len(resources) > 1:
            raise FarmConfigError(
                f"place {place['place']} matches {len(resources)} {RESOURCE_CLASS} resources; give it one"
            )
        if resources:
            params = resources[0]["params"]
            address = tcp_address(str(params["address"]), int(params["port"]))
            entries += [
                DeviceEntry(e.name, e.address, labels=dict(place["tags"]))
                for e in parse_address(address, name=place["place"])
            ]
    return entries


class PlaceHold:
    """One place reserved and locked by an agent process; `release()` (idempotent) gives it back."""

    def __init__(self, python: str, coordinator: str, place: str, tags: Mapping[str, str]) -> None:
        self.place = place
        self.agent = _agent(python, "hold", coordinator, place, *_tag_args(tags))
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(self.agent.stdout,), daemon=True)
        self._reader.start()
        self._released = threading.Lock()
        self.locked = False

    def _read(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            self._events.put(json.loads(line))
        self._events.put({"error": "labgrid_agent.py ended"})

    def wait(self, timeout: float | None) -> None:
        """Until the place is locked for us; AcquireTimeout after `timeout`, LabgridError when the
        coordinator refuses (or the hold was released meanwhile)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                raise AcquireTimeout(f"labgrid place {self.place} was not free within {timeout:g}s") from None
            if "acquired" in event:
                self.locked = True
                return
            if "error" in event:
                raise LabgridError(f"labgrid place {self.place}: {event['error']}")

    def release(self) -> None:
        """Cancel the reservation and unlock the place: the agent does both when its stdin closes."""
        if not self._released.acquire(blocking=False):
            return
        if self.agent.stdin is not None:
            self.agent.stdin.close()
        try:
            self.agent.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            self.agent.wait()


class PlaceLease:
    """A device's daemon reservation inside its labgrid place: `with lease as device:` gives both back."""

    def __init__(self, lease: Lease, give_place_back: Callable[[], None]) -> None:
        self.lease = lease
        self._give_place_back = give_place_back

    def __enter__(self) -> Device:
        return self.lease.device

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.lease.release()
        finally:
            self._give_place_back()


class LabgridFarm:
    """The places matching `tags` as a device pool for the fan-out (runner.DevicePool)."""

    def __init__(self, coordinator: str | None, tags: Mapping[str, str], **options: Any) -> None:
        self.coordinator = coordinator_address(coordinator)
        self.tags = dict(tags)
        self._python = labgrid_python()
        self._farm = Farm(place_entries(self._python, self.coordinator, self.tags), **options)
        self._lock = threading.Lock()
        self._holds: set[PlaceHold] = set()
        self._cancelled = threading.Event()

    @property
    def entries(self) -> list[DeviceEntry]:
        return self._farm.entries

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def acquire(self, *, name: str, timeout: float | None = None) -> PlaceLease:
        """Wait for place `name` in labgrid's queue and lock it, then reserve its daemon; all within
        `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        hold = PlaceHold(self._python, self.coordinator, name, self.tags)
        with self._lock:
            self._holds.add(hold)
        try:
            try:
                hold.wait(timeout)
            except LabgridError:
                if not self.cancelled:
                    raise
            if self.cancelled:  # cancel() gives a place waited for up, maybe just as it was locked
                raise Cancelled(f"cancelled while waiting for place {name}")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return PlaceLease(self._farm.acquire(name=name, timeout=left), lambda: self._give_back(hold))
        except BaseException:
            self._give_back(hold)
            raise

    def _give_back(self, hold: PlaceHold) -> None:
        hold.release()
        with self._lock:
            self._holds.discard(hold)

    def cancel(self, grace_s: float = CANCEL_GRACE_S) -> None:
        """As Farm.cancel: the places still waited for are given up at once, the devices running get
        `grace_s` to stop and give theirs back, then every place left is unlocked under them."""
        self._cancelled.set()
        with self._lock:
            holds = list(self._holds)
        for hold in holds:
            if not hold.locked:
                hold.release()
        self._farm.cancel(grace_s)
        for hold in holds:
            hold.release()
