"""The daemon: one grpc.aio server on one event loop, with health, reflection, the session reaper,
the guard (tokens, in-flight limit), TLS, and graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rknn_proto import codec, rknn_pb2, rknn_pb2_grpc
from rknn_proto.ready import ReadyInfo, listening_line, write_ready_file
from rknn_proto.version import HTTP2_OPTIONS, MAX_MESSAGE_BYTES
from rknn_server import __version__
from rknn_server.auth import AccessPolicy, TlsFiles, TokenTable, listen_policy
from rknn_server.data_plane import DataPlane, SessionLimits
from rknn_server.guard import CallLimits, Guard
from rknn_server.http_endpoint import HttpAccess, HttpEndpoint, Routes, check_exposure
from rknn_server.legacy import startup as legacy
from rknn_server.legacy.connection import LegacyLimits
from rknn_server.legacy.layouts import DEFAULT_VERSION, RELEASES
from rknn_server.listen import DEFAULT_LISTEN, ListenAddress, ListenError, bind_problem, parse_listen
from rknn_server.memory import MemoryLimits
from rknn_server.metrics import DaemonMetrics, StateCollector
from rknn_server.model_cache import CacheLimits, ModelCache
from rknn_server.platform import probe_platform
from rknn_server.reservations import ReservationBook
from rknn_server.runtime.backend_hook import load_backend
from rknn_server.runtime.isolated import IsolatedBackend
from rknn_server.runtime.select import select_backend
from rknn_server.service import RknnService, ServiceConfig
from rknn_server.telemetry import BoardTelemetry
from rknn_server.upload_wire import add_upload_handler

log = structlog.get_logger("rknn_server")
SERVICE_NAME = rknn_pb2.DESCRIPTOR.services_by_name["RknnServer"].full_name


@dataclass
class DaemonConfig:
    listen: list[ListenAddress] = field(default_factory=lambda: [parse_listen(a) for a in DEFAULT_LISTEN])
    runtime: str = "auto"
    soc: str = ""
    model_cache: Path = field(default_factory=lambda: Path("~/.cache/rknn_server").expanduser())
    cache_limits: CacheLimits = field(default_factory=CacheLimits)
    verify_interval_s: float = 86400.0  # re-hash each cached model this often (0: only when its files change)
    verify_cache: bool = False  # re-hash every cached model at start-up, before serving
    tensor_limits: codec.TensorLimits = field(default_factory=codec.TensorLimits)
    session_idle_timeout_s: float = 300.0
    max_sessions: int = 16
    isolation: str = "thread"  # "thread": in the daemon; "process": one worker process per session
    call_timeout_s: float | None = None
    threads: int | None = None
    grace_s: float = 10.0
    exit_with_stdin: bool = False
    runtime_lib: Path | None = None  # librknnrt/librknnmrt to load instead of searching for one
    plugin_dir: Path | None = None  # custom-op plugins for the rknnrt runtime
    sysfs_root: Path = Path("/")  # where the platform probe reads /proc, /sys and /dev
    max_sessions_per_client: int = 0
    max_inflight_requests: int = 64
    max_message_bytes: int = MAX_MESSAGE_BYTES
    auth_token_file: Path | None = None
    trust_loopback: bool = False  # let this machine's callers in without a token or certificate
    tls: TlsFiles | None = None
    insecure: bool = False
    backend: str = ""  # MODULE:CALLABLE serving instead of `runtime` (see runtime/backend_hook.py)
    # Fair use (server/guard.py): calls one client may have in flight, how long a request stream
    # may stay silent (0: forever).
    max_inflight_per_client: int = 16
    stream_idle_timeout_s: float = 30.0
    # Memory budgets (server/memory.py): incoming frames' buffers, and what one session may use.
    memory: MemoryLimits = field(default_factory=MemoryLimits.for_machine)
    metrics_listen: ListenAddress | None = None  # HTTP: /metrics and the KServe v2 health endpoints
    ready_file: Path | None = None  # JSON of the bound listeners, written once serving (rknn_proto.ready)
    # Where the RKNN-Toolkit2 protocol is served (server/legacy): None = the default, () = off.
    legacy_listen: tuple[str, ...] | None = None
    legacy_toolkit: str = DEFAULT_VERSION  # whose message layout it speaks (a key of layouts.RELEASES)


# Server keepalive: ping an idle connection every 60 s and drop it when the ping is not answered in
# 20 s (a vanished peer frees its calls), let clients ping down to every 10 s, and close connections
# that carried no call for 30 min (the client reconnects transparently).
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_connection_idle_ms", 30 * 60_000),
]

# What a client may send ahead of the daemon reading it: a fixed 8 MiB per stream. gRPC's default
# grows the window from its bandwidth probes; on a loaded machine the daemon's peak RSS then grew by
# 90-190 MiB over four 1 GiB uploads, and by 50-70 MiB with this, at the same throughput (measured
# here; the 64 MiB round trip's time did not change).
RECEIVE_WINDOW_OPTIONS = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 8 << 20),
]


async def _reap(plane: DataPlane, period: float) -> None:
    while True:
        await asyncio.sleep(period)
        await plane.reap()


async def _maintain_cache(cache: ModelCache, executor: ThreadPoolExecutor, config: DaemonConfig) -> None:
    """Drop expired partial uploads and re-hash models due for verification, in the executor."""
    periods = [t / 2 for t in (config.verify_interval_s, config.cache_limits.partial_ttl_s) if t > 0]
    if not periods:
        return
    period = min(60.0, max(0.5, min(periods)))
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period)
        try:
            await loop.run_in_executor(executor, cache.expire_partials)
            if config.verify_interval_s > 0:
                await loop.run_in_executor(executor, cache.verify_due, config.verify_interval_s)
        except Exception:
            log.exception("cache_maintenance_failed")


def _verify_cache(cache: ModelCache) -> None:
    """--verify-cache: hash every cached model again before serving; damaged ones are removed."""
    digests = cache.cached_digests()
    damaged = cache.verify_all()
    report = log.warning if damaged else log.info
    report("cache_verified", models=len(digests), damaged=damaged, removed=len(damaged))


def _wait_stdin_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    while sys.stdin.buffer.read(1 << 16):
        pass
    loop.call_soon_threadsafe(stop.set)


def _server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    cert, key, client_ca = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _add_port(
    server: grpc.aio.Server, address: ListenAddress, credentials: grpc.ServerCredentials | None
) -> int:
    """Listen on `address` (TLS on TCP when configured); returns the bound port or raises ListenError."""
    problem = bind_problem(address)
    if problem is None:
        try:
            if credentials is not None and address.scheme == "tcp":
                port: int | None = server.add_secure_port(address.grpc_address(), credentials)
            else:
                port = server.add_insecure_port(address.grpc_address())
        except RuntimeError:  # taken between the check and grpc's bind
            port = None
        if port is not None and (port != 0 or address.scheme != "tcp"):
            return port
        problem = "grpc could not bind it"
    raise ListenError(f"cannot listen on {address.display()}: {problem}; fix --listen")


def _call_limits(config: DaemonConfig) -> CallLimits:
    return CallLimits(
        config.max_inflight_requests, config.max_inflight_per_client, config.stream_idle_timeout_s
    )


async def serve(config: DaemonConfig, ready: asyncio.Event | None = None) -> int:
    tokens = TokenTable.load(config.auth_token_file) if config.auth_token_file else None
    credentials = _server_credentials(config.tls) if config.tls else None
    access = AccessPolicy(
        tokens, config.tls is not None and config.tls.client_ca is not None, config.trust_loopback
    )
    exposure = listen_policy(config.listen, access.required, config.insecure, tls=credentials is not None)
    warnings = list(exposure)
    if config.trust_loopback and access.required:
        warnings.append(
            "--trust-loopback: every process on this machine (and in its network namespace, and adb users) "
            "may call without a token or certificate"
        )
    if config.metrics_listen is not None:
        warnings += check_exposure(config.metrics_listen, tokens is not None, config.insecure)
    probe = probe_platform(config.sysfs_root)
    legacy_plan = legacy.plan(
        config.legacy_listen, bool(probe.npu_device) and config.sysfs_root == Path("/"), tokens is not None
    )
    warnings += legacy_plan.warnings
    if config.call_timeout_s and config.isolation != "process":
        warnings.append(
            "--call-timeout is enforced only with --isolation process (a thread cannot be killed)"
        )
    for text in warnings:
        log.warning("insecure_configuration", warning=text)
    if config.backend:
        backend, reason = load_backend(config.backend), f"backend {config.backend} requested (--backend)"
    else:
        backend, reason = select_backend(
            config.runtime,
            config.soc,
            config.threads,
            probe=probe,
            runtime_lib=config.runtime_lib,
            plugin_dir=config.plugin_dir,
        )
    cache = ModelCache(config.model_cache, config.cache_limits)
    if config.verify_cache:
        _verify_cache(cache)
    metrics = DaemonMetrics()
    executor = ThreadPoolExecutor(
        max_workers=max(4, config.max_sessions, config.max_inflight_requests), thread_name_prefix="runtime"
    )

    if config.isolation == "process":
        backend = IsolatedBackend(backend, config.call_timeout_s, metrics.worker_lost)
    reservations = ReservationBook()
    plane = DataPlane(
        backend,
        cache,
        executor,
        metrics,
        config.tensor_limits,
        SessionLimits(config.max_sessions, config.session_idle_timeout_s, config.max_sessions_per_client),
        config.memory,
        reservations.admit,
    )
    service = RknnService(
        plane,
        reservations,
        ServiceConfig(
            runtime_reason=reason,
            board=probe.board_model,
            max_message_bytes=config.max_message_bytes,
            max_inflight_requests=config.max_inflight_requests,
            call_timeout_s=(config.call_timeout_s or 0.0) if config.isolation == "process" else 0.0,
            auth_required=access.required,
            tls=credentials is not None,
            insecure=bool(exposure),
            warnings=tuple(warnings),
            instance_id=secrets.token_hex(8),
        ),
        metrics,
    )
    guard = Guard(access, _call_limits(config))
    metrics.watch(
        StateCollector(
            plane.registry.__len__,
            reservations.info_fields,
            lambda: guard.per_client,
            lambda: guard.refused,
            cache,
        )
    )
    metrics.watch(BoardTelemetry(config.sysfs_root))
    server = grpc.aio.server(
        interceptors=[guard],
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *KEEPALIVE_OPTIONS,
            *HTTP2_OPTIONS,
            *RECEIVE_WINDOW_OPTIONS,
        ],
    )
    rknn_pb2_grpc.add_RknnServerServicer_to_server(service, server)
    add_upload_handler(server, service)
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    from grpc_reflection.v1alpha import reflection

    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    bound = []
    for address in config.listen:
        port = _add_port(server, address, credentials)
        bound.append(address.display(port))
        if address.scheme == "tcp":
            access.listeners.append((address.host, port))
    serving = asyncio.Event()
    http_server, metrics_url = None, ""
    if config.metrics_listen is not None:
        endpoint = HttpEndpoint(
            Routes(metrics.exposition, serving.is_set), HttpAccess(tokens, not config.trust_loopback)
        )
        http_server, http_port = await endpoint.start(config.metrics_listen)
        metrics_url = config.metrics_listen.display(http_port).replace("tcp://", "http://", 1) + "/metrics"
    # Stop signals are handled before the daemon says it is ready: a SIGTERM right after the
    # `listening on` lines (or the ready file) is a clean stop.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    legacy_limits = LegacyLimits(
        config.tensor_limits, config.cache_limits.max_model_bytes, config.max_message_bytes
    )
    legacy_listener, legacy_bound = await legacy.start(
        legacy_plan, plane, legacy_limits, RELEASES[config.legacy_toolkit]
    )
    bound += [f"{place} (RKNN-Toolkit2 protocol)" for place in legacy_bound]
    for status_name in ("", SERVICE_NAME):
        await health_servicer.set(status_name, health_pb2.HealthCheckResponse.SERVING)
    serving.set()
    if config.ready_file is not None:
        write_ready_file(
            config.ready_file,
            ReadyInfo(os.getpid(), __version__, service.config.instance_id, bound, metrics_url),
        )
    for text in bound:
        print(listening_line(text), flush=True)
    if metrics_url:
        print(f"metrics on {metrics_url}", flush=True)
    log.info(
        "daemon_started",
        version=__version__,
        runtime=backend.name,
        reason=reason,
        listen=bound,
        metrics=metrics_url or None,
        soc=backend.soc(),
        auth=[
            kind for kind, on in (("token", tokens), ("client-certificate", access.client_certificates)) if on
        ],
        trust_loopback=config.trust_loopback,
        tls=credentials is not None,
        instance=service.config.instance_id,
    )

    if config.exit_with_stdin:
        threading.Thread(target=_wait_stdin_eof, args=(loop, stop), daemon=True).start()
    reaper = asyncio.create_task(_reap(plane, min(1.0, config.session_idle_timeout_s / 4)))
    maintenance = asyncio.create_task(_maintain_cache(cache, executor, config))
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("daemon_stopping", grace_s=config.grace_s, sessions=len(plane.registry))
    serving.clear()  # /v2/health/ready answers 503 while the calls in flight finish
    await health_servicer.enter_graceful_shutdown()
    await server.stop(config.grace_s)
    if http_server is not None:
        http_server.close()
    await legacy_listener.close()
    reaper.cancel()
    maintenance.cancel()
    plane.close_all("daemon shutting down")
    executor.shutdown(wait=False, cancel_futures=True)
    if config.ready_file is not None:
        config.ready_file.unlink(missing_ok=True)
    log.info("daemon_stopped")
    return 0


def run(config: DaemonConfig) -> int:
    """Run the daemon on uvloop when it is installed (it has no armv7 wheels), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config))
    if sys.version_info >= (3, 11):
        return uvloop.run(serve(config))
    uvloop.install()
    return asyncio.run(serve(config))
