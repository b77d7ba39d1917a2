"""Farms scheduled by labgrid's coordinator: its places are the devices, its queue decides who waits.

A board's daemon is a labgrid resource in an exporter's configuration: RKNNDaemon (`address`,
`port`) for a daemon on the network, RKNNAdbDaemon (`serial`, and the `address`, `port` its host
forwards the daemon's socket to) for a board on that host's adb. A place that matches one, with
tags (`soc=rk3588`), is one device. A device is held through a labgrid reservation filtered by tags
(a run's tags and `name=PLACE` for one place, a test's tags for any place that has them), waited for
in the coordinator's queue at the farm's priority and locked; then the daemon's own reservation is
taken as for any farm device (so a PC outside labgrid cannot skew the timing either); both are given
back after the device's use.

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from rknn_client.device import Device
from rknn_client.errors import RknnError
from rknn_client.farm.inventory import DeviceEntry, FarmConfigError, parse_address, tcp_address
from rknn_client.farm.pool import CANCEL_GRACE_S, AcquireTimeout, Cancelled, Farm, Lease, NoMatchingDevice

# A daemon on the network, and one on a board behind its host's adb (forwarded to address:port there).
RESOURCE_CLASSES = ("RKNNDaemon", "RKNNAdbDaemon")
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


def _matches(tags: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(tags.get(k) == v for k, v in wanted.items())


@dataclass
class Places:
    """What the coordinator has for a tag filter: the RKNN places as devices, the places that match
    without an RKNN resource (name -> tags), and the places it cannot use (one message each)."""

    entries: list[DeviceEntry] = field(default_factory=list)
    others: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _entry(place: str, tags: Mapping[str, str], resource: Mapping[str, Any]) -> DeviceEntry:
    """The device of a place: named after it, its tags as labels, the TCP address the resource gives
    (an adb board's too: its host forwards the daemon there), the resource's exporter as its host."""
    params = resource["params"]
    try:
        address = tcp_address(str(params["address"]), int(params["port"]))
    except (KeyError, ValueError) as exc:
        raise FarmConfigError(
            f"place {place}: its {resource['cls']} on {resource['exporter']} needs address and port ({exc})"
        ) from None
    (entry,) = parse_address(address, name=place)
    return replace(entry, labels=dict(tags), place=place, host=str(resource["exporter"]))


def list_places(python: str, coordinator: str, tags: Mapping[str, str]) -> Places:
    """The places whose tags include `tags`; a place is a device when it matches exactly one RKNN
    resource."""
    agent = _agent(python, "list", coordinator, ",".join(RESOURCE_CLASSES), *_tag_args(tags))
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
    found = Places()
    for place in answer:
        name, resources = place["place"], place["resources"]
        if not resources:
            found.others[name] = dict(place["tags"])
        elif len(resources) > 1:
            found.problems.append(
                f"place {name} matches {len(resources)} RKNN resources "
                f"({', '.join(r['exporter'] + ' ' + r['cls'] for r in resources)}); give it one"
            )
        else:
            try:
                found.entries.append(_entry(name, place["tags"], resources[0]))
            except FarmConfigError as exc:
                found.problems.append(str(exc))
    return found


class PlaceHold:
    """One place reserved by a tag filter and locked by an agent process; `place` names it once
    locked; `release()` (idempotent) gives it back."""

    def __init__(self, python: str, coordinator: str, wanted: Mapping[str, str], priority: float) -> None:
        self.wanted = dict(wanted)
        self.agent = _agent(python, "hold", coordinator, repr(float(priority)), *_tag_args(wanted))
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(self.agent.stdout,), daemon=True)
        self._reader.start()
        self._released = threading.Lock()
        self.place = ""

    @property
    def locked(self) -> bool:
        return bool(self.place)

    def _read(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            self._events.put(json.loads(line))
        self._events.put({"error": "labgrid_agent.py ended"})

    def _what(self) -> str:
        return " ".join(_tag_args(self.wanted)) or "any place"

    def wait(self, timeout: float | None) -> str:
        """Until a place is locked for us (its name); AcquireTimeout after `timeout`, LabgridError
        when the coordinator refuses (or the hold was released meanwhile)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                raise AcquireTimeout(
                    f"no labgrid place for {self._what()} was free within {timeout:g}s"
                ) from None
            if "acquired" in event:
                self.place = str(event["acquired"])
                return self.place
            if "error" in event:
                raise LabgridError(f"labgrid reservation {self._what()}: {event['error']}")

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
    """A device's daemon reservation inside its labgrid place: `with lease as device:` (or
    `release()`) gives both back. Like a Lease, it has the `entry` and the `device`."""

    def __init__(self, lease: Lease, give_place_back: Callable[[], None]) -> None:
        self.lease = lease
        self.entry = lease.entry
        self.device = lease.device
        self._give_place_back = give_place_back

    def release(self) -> None:
        try:
            self.lease.release()
        finally:
            self._give_place_back()

    def __enter__(self) -> Device:
        return self.device

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class LabgridFarm:
    """The places matching `tags` as a device pool, for the fan-out (runner.DevicePool) and the
    pytest plugin alike; each place waited for at labgrid's reservation `priority`."""

    def __init__(
        self, coordinator: str | None, tags: Mapping[str, str], *, priority: float = 0.0, **options: Any
    ) -> None:
        self.coordinator = coordinator_address(coordinator)
        self.tags = dict(tags)
        self.priority = priority
        self._python = labgrid_python()
        places = list_places(self._python, self.coordinator, self.tags)
        if places.problems:
            raise FarmConfigError("\n".join(places.problems))
        self._others = places.others
        self._farm = Farm(places.entries, **options)
        self._lock = threading.Lock()
        self._holds: set[PlaceHold] = set()
        self._cancelled = threading.Event()

    @property
    def entries(self) -> list[DeviceEntry]:
        return self._farm.entries

    @property
    def holder(self) -> str:
        return self._farm.holder

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _filter(self, soc: str | None, labels: Mapping[str, str] | None, name: str | None) -> dict[str, str]:
        """The reservation's filter: the farm's tags, then the SoC and labels asked for; the name
        last, for one place."""
        wanted = {**self.tags, **(labels or {}), **({"soc": soc.lower()} if soc else {})}
        strays = sorted(p for p, tags in self._others.items() if _matches(tags, wanted) and name in (None, p))
        if strays:  # the coordinator could hand one of them out
            raise FarmConfigError(
                f"the tags {' '.join(_tag_args(wanted))} also match place(s) {', '.join(strays)}, which have "
                f"no {' or '.join(RESOURCE_CLASSES)}: tag the RKNN places apart and ask for that tag"
            )
        if not any(e.matches_labels(wanted) and name in (None, e.name) for e in self.entries):
            names = ", ".join(e.name for e in self.entries) or "none"
            raise NoMatchingDevice(f"no labgrid place has {' '.join(_tag_args(wanted))} (places: {names})")
        return {**wanted, "name": name} if name else wanted

    def acquire(
        self,
        soc: str | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        *,
        name: str | None = None,
        holder: str | None = None,
    ) -> PlaceLease:
        """As Farm.acquire: a place with this SoC and labels (or this name), waited for in labgrid's
        queue and locked, then its daemon reserved; all within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        hold = PlaceHold(self._python, self.coordinator, self._filter(soc, labels, name), self.priority)
        with self._lock:
            self._holds.add(hold)
        try:
            try:
                place = hold.wait(timeout)
            except LabgridError:
                if not self.cancelled:
                    raise
                place = ""
            if self.cancelled:  # cancel() gives a place waited for up, maybe just as it was locked
                raise Cancelled(f"cancelled while waiting for a labgrid place ({hold.wanted})")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            lease = self._farm.acquire(name=place, timeout=left, holder=holder)
            return PlaceLease(lease, lambda: self._give_back(hold))
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
