"""A pool of farm devices handing out exclusive, self-renewing reservations.

`Farm.acquire()` probes the matching devices, queues a Reserve call on every healthy one at once
(the daemons serve their queues first come, first served) and takes the first device granted,
withdrawing from the other queues. Only a device that answers and is reserved by someone else is
waited for: an unreachable one (refused, unresolvable, NOT_SERVING, a version mismatch) is skipped
at once and probed again every `reprobe_s` while waiting for the others, and when no matching
device is reachable acquire fails at once with each one's reason. The Lease renews its reservation
in the background; if this process dies the renewals stop and the daemon hands the device to the
next waiter after the TTL. `Farm.cancel()` (Ctrl-C) ends every acquire and releases every lease.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rknn_client.device import Device
from rknn_client.errors import FailedPrecondition, NotFound, RknnError
from rknn_client.farm.inventory import DeviceEntry, gather
from rknn_client.farm.probe import DeviceStatus, open_device, probe
from rknn_client.reservation import PendingReservation, Reservation
from rknn_client.transport.base import TransportError

# How long a Reserve call queues when the caller gives no timeout.
WAIT_FOREVER_S = 7 * 24 * 3600.0
# After cancel(), how long the leases' holders get to stop at their next step, closing their sessions
# themselves, before their leases are released under them (which leaves those sessions to time out).
CANCEL_GRACE_S = 10.0


class NoMatchingDevice(RknnError):
    """No device of the farm has the SoC and labels asked for."""


class AcquireTimeout(RknnError):
    """Matching devices answer, but none became free in time."""


class NoReachableDevice(RknnError):
    """Matching devices exist, but none of them answers (the message gives each one's reason)."""


class Cancelled(RknnError):
    """The farm was cancelled (Ctrl-C): no new reservation is handed out."""


def default_holder(tag: str = "") -> str:
    """How this process introduces itself to the devices it reserves."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    text = f"{user}@{socket.gethostname()} pid {os.getpid()}"
    return f"{text} ({tag})" if tag else text


class Lease:
    """An exclusive reservation of one device; `with lease as device:` releases it at the end."""

    def __init__(
        self,
        entry: DeviceEntry,
        device: Device,
        reservation: Reservation,
        holder: str,
        on_release: Callable[[Lease], None] = lambda _: None,
    ) -> None:
        self.entry = entry
        self.device = device
        self.holder = holder
        self.ttl_s = reservation.ttl_s
        self.waited_s = reservation.waited_s
        self._token = reservation.token
        device.use_reservation(reservation.token)
        self.lost = ""
        self._on_release = on_release
        self._release_lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name=f"renew-{entry.name}", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        period = max(0.1, self.ttl_s / 3)
        while not self._stop.wait(period):
            try:
                self.device.renew_reservation(self._token, timeout=period)
            except NotFound as exc:
                self.lost = str(exc)
                return
            except RknnError:
                continue  # the daemon may answer again before the TTL runs out

    def release(self) -> None:
        """Give the device back (idempotent, from any thread); a reservation already lost is not an
        error. Closing the device also cancels the calls still running on it."""
        with self._release_lock:
            if self._stop.is_set():
                return
            self._stop.set()
        self._renewer.join()
        try:
            if not self.lost:
                _release(self.device, self._token)
        finally:
            self.device.close()
            self._on_release(self)

    def __enter__(self) -> Device:
        return self.device

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@dataclass
class _Attempt:
    """A Reserve call queued on one device."""

    entry: DeviceEntry
    device: Device
    pending: PendingReservation


class Farm:
    def __init__(
        self,
        entries: Iterable[DeviceEntry],
        *,
        holder: str | None = None,
        ttl_s: float = 30.0,
        probe_timeout_s: float = 3.0,
        reprobe_s: float = 2.0,
    ) -> None:
        self.entries = list(entries)
        self.holder = holder or default_holder()
        self.ttl_s = ttl_s
        self.probe_timeout_s = probe_timeout_s
        self.reprobe_s = reprobe_s
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._leases: set[Lease] = set()
        self._wakeups: set[queue.Queue[str]] = set()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, grace_s: float = CANCEL_GRACE_S) -> None:
        """End every acquire in progress (they raise Cancelled) and every lease held: their holders
        get `grace_s` to give them back (a run stops between two calls and closes its session first),
        then the rest are released under them."""
        with self._lock:
            self._cancelled.set()
            wakeups = list(self._wakeups)
        for done in wakeups:
            done.put("")
        with self._released:
            self._released.wait_for(lambda: not self._leases, grace_s)
            leases = list(self._leases)
        for lease in leases:
            lease.release()

    def _lease(self, entry: DeviceEntry, device: Device, reservation: Reservation, holder: str) -> Lease:
        """A Lease this farm tracks; one granted after cancel() is given back at once."""
        lease = Lease(entry, device, reservation, holder, on_release=self._forget)
        with self._lock:
            if not self._cancelled.is_set():
                self._leases.add(lease)
                return lease
        lease.release()
        raise Cancelled(f"cancelled: the reservation of {entry.name} was given back")

    def _forget(self, lease: Lease) -> None:
        with self._released:
            self._leases.discard(lease)
            self._released.notify_all()

    @classmethod
    def from_sources(
        cls, farm_file: Path | str | None = None, addresses: Iterable[str] = (), **options: Any
    ) -> Farm:
        return cls(gather(farm_file, addresses), **options)

    @classmethod
    def from_file(cls, farm_file: Path | str, **options: Any) -> Farm:
        return cls.from_sources(farm_file, **options)

    def statuses(self, entries: Iterable[DeviceEntry] | None = None) -> list[DeviceStatus]:
        """Probe devices in parallel, in inventory order."""
        chosen = list(self.entries if entries is None else entries)
        if not chosen:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(chosen))) as pool:
            return list(pool.map(lambda e: probe(e, self.probe_timeout_s), chosen))

    def select(self, labels: Mapping[str, str] | None = None, name: str | None = None) -> list[DeviceEntry]:
        wanted = dict(labels or {})
        return [e for e in self.entries if e.matches_labels(wanted) and name in (None, e.name)]

    def acquire(
        self,
        soc: str | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        *,
        name: str | None = None,
        holder: str | None = None,
    ) -> Lease:
        """Reserve a healthy device with this SoC and labels (or this name), waiting up to `timeout`
        for one that answers but is reserved; NoReachableDevice at once when none answers."""
        wanted = (
            " ".join(
                f"{k}={v}" for k, v in (("name", name), ("soc", soc), ("labels", dict(labels or {}))) if v
            )
            or "soc=any"
        )
        candidates = self.select(labels, name)
        if not candidates:
            raise NoMatchingDevice(f"no device of the farm matches {wanted} (devices: {self._names()})")
        deadline = None if timeout is None else time.monotonic() + timeout
        who = holder or self.holder
        done: queue.Queue[str] = queue.Queue()
        attempts: dict[str, _Attempt] = {}
        state: dict[str, str] = {}
        next_probe: dict[str, float] = {}
        with self._lock:
            self._wakeups.add(done)
        try:
            while True:
                self._check_cancelled()
                now = time.monotonic()
                due = [e for e in candidates if e.name not in attempts and next_probe.get(e.name, 0.0) <= now]
                ready: list[DeviceStatus] = []
                for status in self.statuses(due):
                    entry = status.entry
                    if not status.healthy:
                        state[entry.name] = f"unreachable: {status.error}"
                        next_probe[entry.name] = now + self.reprobe_s
                    elif soc and status.soc != soc.lower():
                        candidates.remove(entry)
                        state[entry.name] = f"is a {status.soc or 'SoC-less'} device"
                    else:
                        state[entry.name] = (
                            f"reserved by {status.reserved_by}" if status.reserved_by else "free"
                        )
                        ready.append(status)
                # Free devices first, least loaded first: taken at once, one at a time, so that no
                # device is reserved only to be given back.
                for status in sorted(ready, key=lambda s: (bool(s.reserved_by), s.open_sessions)):
                    entry = status.entry
                    try:
                        if not status.reserved_by and (lease := self._reserve_now(entry, who)):
                            return lease
                        self._check_cancelled()
                        attempts[entry.name] = self._queue(entry, who, deadline, done)
                    except Cancelled:
                        raise
                    except (TransportError, RknnError) as exc:
                        state[entry.name] = f"unreachable: {exc}"
                        next_probe[entry.name] = now + self.reprobe_s
                if not candidates:
                    raise NoMatchingDevice(f"no device of the farm matches {wanted}: {self._describe(state)}")
                if not attempts:  # every candidate left was just found unreachable
                    raise NoReachableDevice(
                        f"no device matching {wanted} is reachable: {self._describe(state)}"
                    )
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise AcquireTimeout(
                        f"no device matching {wanted} became free within {timeout:g}s: {self._describe(state)}"
                    )
                try:
                    finished = done.get(
                        timeout=min(self.reprobe_s, left) if left is not None else self.reprobe_s
                    )
                except queue.Empty:
                    continue
                if finished not in attempts:  # woken by cancel()
                    continue
                attempt = attempts.pop(finished)
                try:
                    reservation = attempt.pending.result()
                except RknnError as exc:
                    attempt.device.close()
                    state[finished] = str(exc)
                    if not isinstance(exc, FailedPrecondition):
                        next_probe[finished] = time.monotonic() + self.reprobe_s
                    continue
                return self._lease(attempt.entry, attempt.device, reservation, who)
        finally:
            with self._lock:
                self._wakeups.discard(done)
            for attempt in attempts.values():
                _withdraw(attempt)

    def _check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise Cancelled("cancelled before a device was reserved")

    def _reserve_now(self, entry: DeviceEntry, holder: str) -> Lease | None:
        """Reserve a device that looked free, without queueing; None when someone was faster."""
        device = open_device(entry)
        try:
            reservation = device.reserve(holder, self.ttl_s, timeout=self.probe_timeout_s)
        except BaseException as exc:
            device.close()
            if isinstance(exc, FailedPrecondition):
                return None
            raise
        return self._lease(entry, device, reservation, holder)

    def _queue(
        self, entry: DeviceEntry, holder: str, deadline: float | None, done: queue.Queue[str]
    ) -> _Attempt:
        """Queue a Reserve call on a device; its completion is announced on `done`."""
        device = open_device(entry)
        wait_s = WAIT_FOREVER_S if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            pending = device.queue_reservation(
                holder, self.ttl_s, wait_s, timeout=None if deadline is None else wait_s + 10
            )
        except BaseException:
            device.close()
            raise
        pending.add_done_callback(lambda: done.put(entry.name))
        return _Attempt(entry, device, pending)

    def _names(self) -> str:
        return ", ".join(e.name for e in self.entries) or "none"

    @staticmethod
    def _describe(state: Mapping[str, str]) -> str:
        return "; ".join(f"{k}: {v}" for k, v in state.items()) or "no device answered"


def _withdraw(attempt: _Attempt) -> None:
    """Leave a device's queue. The daemon may have granted the call just before the cancellation
    reached it (the answer is then lost), so release the token unless the call plainly failed."""
    if attempt.pending.withdraw():
        _release(attempt.device, attempt.pending.token)
    attempt.device.close()


def _release(device: Device, token: str) -> None:
    """Give a reservation back; NOT_FOUND (never granted, or already gone) and an unreachable
    daemon are fine: the reservation does not exist or expires by itself."""
    with contextlib.suppress(RknnError):
        device.release_reservation(token, timeout=10)


__all__ = [
    "AcquireTimeout",
    "Cancelled",
    "Farm",
    "Lease",
    "NoMatchingDevice",
    "NoReachableDevice",
    "default_holder",
]
