"""Connection admission for the connection-oriented doors: the toolkit (legacy) listener and the HTTP
listener (gRPC has its own guard, server/kit/guard.py).

Every connection is counted in by a `Gate` before a byte of it is read, under the identity its socket
gives (the caller's uid, `uid:N` as gRPC names a tokenless local caller), and counted out when it
closes: one identity cannot take more than its share of the door, nor all of them together more than
the door holds, so a peer hoarding idle connections shuts out neither the others nor the daemon's own
file descriptors. Reads wait at most the door's idle deadline (`within`); a silent peer is closed.
At start the daemon raises its soft RLIMIT_NOFILE to the hard limit (`raise_open_files`), keeping
room for gRPC, the model cache and the runtime beyond what the doors may hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
from collections import Counter
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rknn_server.board.peers import uid_identity
from rknn_server.config.limits import DoorLimits
from rknn_server.errors import ResourceExhausted

log = structlog.get_logger("rknn_server.connections")
T = TypeVar("T")
# File descriptors kept for everything but the doors' connections: gRPC's connections, the model
# cache's files, the runtime, worker processes' pipes, shared-memory regions.
FD_HEADROOM = 512
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Refused(ResourceExhausted):
    """A connection the door has no room for; the message names the cap and its flag."""


class IdleTimeout(Exception):
    """The peer sent nothing within the door's idle deadline."""


@dataclass
class Gate:
    """Counts one door's open connections per identity and in total, and what it turned away."""

    door: str  # "toolkit" | "http", the label of its metrics and the prefix of its flags
    limits: DoorLimits
    idle_flag: str  # the flag of its idle deadline, named when it closes a peer
    open: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # by reason: "total" | "per_client"
    idle_closed: int = 0

    @property
    def total(self) -> int:
        return sum(self.open.values())

    @contextlib.contextmanager
    def admit(self, identity: str) -> Iterator[None]:
        """Count the connection of `identity` in for the block (raises Refused when the door is full)."""
        self._enter(identity)
        try:
            yield
        finally:
            self.open[identity] -= 1
            if self.open[identity] <= 0:
                del self.open[identity]

    def _enter(self, identity: str) -> None:
        flag = f"--max-{self.door}-connections"
        if self.total >= self.limits.max_connections:
            self.refused["total"] += 1
            raise Refused(
                f"the {self.door} listener holds its most connections, {self.limits.max_connections} ({flag}); "
                "retry later"
            )
        if self.open[identity] >= self.limits.max_per_client:
            self.refused["per_client"] += 1
            raise Refused(
                f"{identity} already holds {self.open[identity]} {self.door} connections, the most one client "
                f"may ({flag}-per-client); close one first"
            )
        self.open[identity] += 1

    async def within(self, awaitable: Awaitable[T], what: str) -> T:
        """Await a read of the peer, for at most the idle deadline (raises IdleTimeout, counted)."""
        timeout = self.limits.idle_timeout_s
        if not timeout:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, timeout)
        except asyncio.TimeoutError:
            self.idle_closed += 1
            raise IdleTimeout(f"no {what} within {timeout:g} s ({self.idle_flag})") from None


def unix_peer_uid(sock: Any) -> int:
    """The user at the other end of a unix socket, as the kernel says (SO_PEERCRED), not as it claims."""
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(uid)


def unix_peer_identity(sock: Any) -> str:
    """Who is at the other end of a unix socket, named as on every door: `uid:N`."""
    return uid_identity(unix_peer_uid(sock))


def grpc_peer(address: Any) -> str:
    """A TCP peer's address as grpc writes it ("ipv4:127.0.0.1:5555", "ipv6:[::1]:5555"), so that
    the HTTP door names callers with the gRPC doors' rule (auth.AccessPolicy.admit)."""
    if not isinstance(address, tuple):
        return "unknown"
    host, port = address[0], address[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def raise_open_files(door_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (the default soft 1024 is a few hundred idle
    peers away from refusing gRPC its sockets); warn when the doors' caps leave gRPC too little."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:  # an infinite hard limit above the kernel's nr_open
            log.warning("open_files_not_raised", soft=soft, hard=hard, error=str(exc))
    needed = door_connections + FD_HEADROOM
    if soft < needed:
        log.warning(
            "open_files_limit_low",
            limit=soft,
            needed=needed,
            hint="raise LimitNOFILE (systemd) / ulimit -n, or lower --max-toolkit-connections and "
            "--max-http-connections",
        )
    return soft


class GateCollector(Collector):
    """The doors' connections open, refused and closed for idling, read at scrape time."""

    def __init__(self, gates: Sequence[Gate]) -> None:
        self._gates = gates

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily("rknn_door_connections", "Connections open, by door", labels=["door"])
        refused = CounterMetricFamily(
            "rknn_door_refused",
            "Connections refused at once, by door and the cap reached (total or per_client)",
            labels=["door", "reason"],
        )
        idle = CounterMetricFamily(
            "rknn_door_idle_closed", "Connections closed for sending nothing in time", labels=["door"]
        )
        for gate in self._gates:
            open_.add_metric([gate.door], gate.total)
            for reason in ("total", "per_client"):
                refused.add_metric([gate.door, reason], gate.refused[reason])
            idle.add_metric([gate.door], gate.idle_closed)
        yield from (open_, refused, idle)


__all__ = [
    "Gate",
    "GateCollector",
    "IdleTimeout",
    "Refused",
    "grpc_peer",
    "raise_open_files",
    "unix_peer_identity",
    "unix_peer_uid",
]
