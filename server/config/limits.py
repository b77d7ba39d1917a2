"""Every limit the daemon enforces, declared once; GetInfo reports them (service.wire_limits).

A limit is one field here, named exactly like its field of `rknn_pb2.Limits` and like the `dest` of
its `rknn_server` flag, so that the flags build a `Limits` and GetInfo reports it without a list of
names in between: a field missing from the proto fails at once (tests/unit/server/config/test_limits.py,
tests/reliability/test_limits_reported.py). Each field also declares its flag's help and valid range
(`_limit`); server/cli.py adds the flags from them, and the range is checked alike for a flag, an
RKNN_SERVER_* variable and a config-file key (options.Bounded). The parts that enforce them get
their own small views (`tensors()`, `cache()`, ...), built from this one object in `serve`; the view
types live here too, so this module imports nothing of the daemon (the option parser reads it, and
`rknn_server --help` need not load the daemon).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

from rknn_proto.tensor_limits import TensorLimits
from rknn_proto.version import MAX_MESSAGE_BYTES
from rknn_server.config.options import YEAR_S, Bounded, Kind
from rknn_server.config.sizes import machine_ram

_TENSORS = TensorLimits()
T = TypeVar("T", int, float)
# The widest ranges: what a board could ever use, and what fits the wire (uint32 counts, uint64 sizes)
# and gRPC (a signed 32-bit message size).
_COUNT, _SIZE, _MESSAGE = 1 << 16, 1 << 50, 1 << 30


# -- the views: what each part that enforces limits is handed (built from one Limits in `serve`) --------


@dataclass(frozen=True)
class SessionLimits:
    """The session registry's (sessions.py)."""

    # Sessions of one model share its runtime (a host session costs ~0.05 MiB beside it), so the cap is
    # on callers, not models: 16 ran out under a 16-client load test.
    max_sessions: int = 64
    idle_timeout_s: float = 300.0
    max_per_client: int = 0


@dataclass(frozen=True)
class CacheLimits:
    """The model cache's (model_cache.py)."""

    quota_bytes: int = 16 << 30
    max_model_bytes: int = 8 << 30
    max_model_files: int = 1024
    partial_ttl_s: float = 3600.0  # 0: partial uploads are kept until evicted for room


@dataclass(frozen=True)
class MemoryLimits:
    """The memory budgets (memory.py), 0 meaning unlimited. Defaults: half the RAM for the daemon, a
    quarter per session."""

    max_memory: int = 0
    max_session_memory: int = 0

    @classmethod
    def for_machine(cls, ram: int | None = None) -> MemoryLimits:
        ram = machine_ram() if ram is None else ram
        return cls(max_memory=ram // 2, max_session_memory=ram // 4)


@dataclass(frozen=True)
class DoorLimits:
    """One connection-oriented door's caps (connections.py): connections in total, per identity, and the
    seconds a read may wait (0: no deadline) — for the toolkit listener the idle time between and within
    requests, for HTTP the time to send the request head."""

    max_connections: int
    max_per_client: int
    idle_timeout_s: float


# The doors' defaults. Toolkit callers through adb all arrive as adbd's user, so its per-client cap is
# its share of the board; a session left idle as long as a connection is freed anyway.
TOOLKIT = DoorLimits(max_connections=64, max_per_client=16, idle_timeout_s=300.0)
HTTP = DoorLimits(max_connections=64, max_per_client=8, idle_timeout_s=5.0)


@dataclass(frozen=True)
class LimitFlag:
    """How one limit is set: its flag (`--` and the field's name in dashes unless given), its help and
    the values it accepts. Its type follows the field's name: `*_bytes` a size, `*_s` seconds, else a
    count. serve_parser (server/cli.py) adds one flag per field from these."""

    name: str  # the field, and the flag's dest
    flag: str
    help: str
    bounds: Bounded
    cache: bool  # in the "model cache" group of --help, else "sessions and limits"

    @property
    def metavar(self) -> str:
        return {"size": "SIZE", "seconds": "S", "count": "N"}[self.bounds.kind]


@dataclass(frozen=True)
class _Declared:
    low: float
    high: float
    help: str
    flag: str
    cache: bool


def _limit(default: T, low: float, high: float, help: str, *, flag: str = "", cache: bool = False) -> T:
    """A Limits field with its flag's range and help, declared beside its default."""
    return field(default=default, metadata={"flag": _Declared(low, high, help, flag, cache)})


def _kind(name: str) -> Kind:
    return "size" if name.endswith("_bytes") else "seconds" if name.endswith("_s") else "count"


@dataclass(frozen=True)
class Limits:
    """The daemon's limits; 0 means "no limit" for the timeouts, the memory budgets and
    max_sessions_per_client (then max_sessions alone applies)."""

    # Messages and tensors (the frame intake, rknn_proto.codec).
    max_message_bytes: int = _limit(
        MAX_MESSAGE_BYTES,
        64 << 10,
        _MESSAGE,
        "largest message: a gRPC request or reply, a v2 REST body or reply",
    )
    max_chunk_bytes: int = _limit(_TENSORS.max_chunk_bytes, 1, _MESSAGE, "largest tensor or upload chunk")
    max_tensor_bytes: int = _limit(_TENSORS.max_tensor_bytes, 1, _SIZE, "largest tensor")
    max_tensor_rank: int = _limit(_TENSORS.max_rank, 1, 64, "highest tensor rank")
    max_tensor_elements: int = _limit(_TENSORS.max_elements, 1, 1 << 48, "most elements in a tensor")
    max_tensors: int = _limit(_TENSORS.max_tensors, 1, _COUNT, "most tensors in one frame")
    # Sessions (sessions.py) and the runtime call deadline (--isolation process only).
    max_sessions: int = _limit(SessionLimits.max_sessions, 1, _COUNT, "most sessions open at once")
    max_sessions_per_client: int = _limit(
        SessionLimits.max_per_client, 0, _COUNT, "sessions one client may hold (0: --max-sessions)"
    )
    session_idle_timeout_s: float = _limit(
        SessionLimits.idle_timeout_s,
        0.1,
        YEAR_S,
        "free idle sessions after S s",
        flag="--session-idle-timeout",
    )
    call_timeout_s: float = _limit(
        0.0,
        0,
        YEAR_S,
        "with --isolation process, kill a session's worker whose call takes over S s (0: never)",
        flag="--call-timeout",
    )
    # Calls in flight and idle request streams (guard.py).
    max_inflight_requests: int = _limit(64, 1, _COUNT, "calls served at once")
    max_inflight_per_client: int = _limit(
        16,
        1,
        _COUNT,
        "calls one client (token name, certificate or address) may have in flight; a Reserve waiting for "
        "the board counts here but not in --max-inflight-requests",
    )
    stream_idle_timeout_s: float = _limit(
        30.0,
        0,
        YEAR_S,
        "end a request stream (upload, inference) that sends nothing for S s, dropping its buffers (0: never)",
        flag="--stream-idle-timeout",
    )
    # Memory budgets (memory.py); the flags' defaults are sized to the machine (for_machine).
    max_memory_bytes: int = _limit(
        0,
        0,
        _SIZE,
        "what the daemon may hold for incoming tensors of all clients (0: no limit; half the RAM unless set)",
        flag="--max-memory",
    )
    max_session_memory_bytes: int = _limit(
        0,
        0,
        _SIZE,
        "what one session's model may materialize: checked before load, and the address-space limit of its "
        "worker with --isolation process (0: no limit; a quarter of the RAM unless set)",
        flag="--max-session-memory",
    )
    # The model cache (model_cache.py).
    model_cache_quota_bytes: int = _limit(
        CacheLimits.quota_bytes, 1, _SIZE, "model cache size", flag="--cache-quota", cache=True
    )
    max_model_bytes: int = _limit(CacheLimits.max_model_bytes, 1, _SIZE, "largest model accepted", cache=True)
    max_model_files: int = _limit(
        CacheLimits.max_model_files,
        1,
        _COUNT,
        "most files in one model (main file plus external data), checked before anything is written",
        cache=True,
    )
    partial_ttl_s: float = _limit(
        CacheLimits.partial_ttl_s,
        0,
        YEAR_S,
        "drop the bytes of an upload left unfinished for S s (0: keep them until evicted for room)",
        flag="--partial-ttl",
        cache=True,
    )
    # The connection-oriented doors (connections.py): the toolkit listener and the HTTP listener.
    max_toolkit_connections: int = _limit(
        TOOLKIT.max_connections,
        1,
        _COUNT,
        "most connections the RKNN-Toolkit2 (legacy) listener holds at once; more are closed unread",
    )
    max_toolkit_connections_per_client: int = _limit(
        TOOLKIT.max_per_client,
        1,
        _COUNT,
        "most connections one user (uid; adb callers are adbd's) may hold on the RKNN-Toolkit2 (legacy) "
        "listener",
    )
    toolkit_idle_timeout_s: float = _limit(
        TOOLKIT.idle_timeout_s,
        0,
        YEAR_S,
        "close a toolkit connection that sends nothing for S s, freeing its session (0: never)",
        flag="--toolkit-idle-timeout",
    )
    max_http_connections: int = _limit(
        HTTP.max_connections,
        1,
        _COUNT,
        "most connections the HTTP listener (--metrics-listen) holds at once; more are closed unread",
    )
    max_http_connections_per_client: int = _limit(
        HTTP.max_per_client,
        1,
        _COUNT,
        "most connections one peer (its local user, else its address) may hold on the HTTP listener "
        "(--metrics-listen)",
    )
    http_head_timeout_s: float = _limit(
        HTTP.idle_timeout_s,
        0,
        YEAR_S,
        "time an HTTP client has to send its request line and headers (0: no limit)",
        flag="--http-head-timeout",
    )

    @classmethod
    def flags(cls) -> list[LimitFlag]:
        """One flag per field, in the fields' order."""
        found = []
        for f in fields(cls):
            declared = f.metadata.get("flag")
            if not isinstance(declared, _Declared):
                raise TypeError(f"Limits.{f.name} needs its range and help: declare it with _limit(...)")
            option = declared.flag or "--" + f.name.replace("_", "-")
            bounds = Bounded(_kind(f.name), declared.low, declared.high)
            found.append(LimitFlag(f.name, option, declared.help, bounds, declared.cache))
        return found

    @classmethod
    def for_machine(cls) -> Limits:
        """The defaults, with the memory budgets sized to this machine's RAM."""
        memory = MemoryLimits.for_machine()
        return cls(max_memory_bytes=memory.max_memory, max_session_memory_bytes=memory.max_session_memory)

    def without_call_timeout(self) -> Limits:
        """These limits where runtime calls cannot be cut short (a thread cannot be killed)."""
        return replace(self, call_timeout_s=0.0)

    # -- the views of the parts that enforce them ----------------------------------------------

    def tensors(self) -> TensorLimits:
        return TensorLimits(
            max_tensor_bytes=self.max_tensor_bytes,
            max_rank=self.max_tensor_rank,
            max_tensors=self.max_tensors,
            max_elements=self.max_tensor_elements,
            max_chunk_bytes=self.max_chunk_bytes,
        )

    def sessions(self) -> SessionLimits:
        return SessionLimits(self.max_sessions, self.session_idle_timeout_s, self.max_sessions_per_client)

    def memory(self) -> MemoryLimits:
        return MemoryLimits(self.max_memory_bytes, self.max_session_memory_bytes)

    def toolkit_connections(self) -> DoorLimits:
        return DoorLimits(
            self.max_toolkit_connections, self.max_toolkit_connections_per_client, self.toolkit_idle_timeout_s
        )

    def http_connections(self) -> DoorLimits:
        return DoorLimits(
            self.max_http_connections, self.max_http_connections_per_client, self.http_head_timeout_s
        )

    def cache(self) -> CacheLimits:
        return CacheLimits(
            self.model_cache_quota_bytes, self.max_model_bytes, self.max_model_files, self.partial_ttl_s
        )


__all__ = [
    "HTTP",
    "TOOLKIT",
    "CacheLimits",
    "DoorLimits",
    "LimitFlag",
    "Limits",
    "MemoryLimits",
    "SessionLimits",
]
