"""The daemon: one grpc.aio server on one event loop, with health, reflection, the session reaper,
the guard (tokens, in-flight limit), TLS, and graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import grpc
import structlog
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.kserve import grpc_service_pb2_grpc as v2_grpc
from rknn_proto.ready import ReadyInfo, listening_line, write_ready_file
from rknn_proto.version import HTTP2_OPTIONS, MAX_RUN_REPLY_BYTES
from rknn_server import __version__
from rknn_server.board.allocator import reuse_large_buffers
from rknn_server.board.platform import PlatformInfo, probe_platform
from rknn_server.board.telemetry import BoardTelemetry
from rknn_server.config.daemon_config import DaemonConfig
from rknn_server.config.limits import Limits
from rknn_server.config.listen import ListenAddress, ListenError, bind_problem
from rknn_server.core.data_plane import DataPlane
from rknn_server.core.shm import SharedMemoryRegistry, ShmLimits
from rknn_server.kit.auth import AccessPolicy, TlsFiles, TokenTable, listen_policy
from rknn_server.kit.connections import GateCollector, raise_open_files
from rknn_server.kit.guard import Guard
from rknn_server.observe.calls import Recorder
from rknn_server.observe.metrics import DaemonMetrics, StateCollector
from rknn_server.protocols.grpc.service import CODECS, RknnService, ServiceConfig
from rknn_server.protocols.kserve import grpc_service as v2
from rknn_server.protocols.kserve.models import V2Models
from rknn_server.protocols.kserve.repository import ModelRepository
from rknn_server.protocols.kserve.system_shm import SystemRegions
from rknn_server.protocols.legacy import startup as legacy
from rknn_server.protocols.legacy.connection import LegacyLimits
from rknn_server.protocols.legacy.layouts import RELEASES
from rknn_server.protocols.local.doorbell import Doorbells
from rknn_server.runtime.backend_hook import load_backend
from rknn_server.runtime.base import Backend
from rknn_server.runtime.isolated import IsolatedBackend
from rknn_server.runtime.select import select_backend
from rknn_server.store.model_cache import ModelCache
from rknn_server.store.reservations import ReservationBook

log = structlog.get_logger("rknn_server")
SERVICE_NAME = rknn_pb2.DESCRIPTOR.services_by_name["RknnServer"].full_name


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


async def _reap(plane: DataPlane, shared: SharedMemoryRegistry, period: float) -> None:
    while True:
        await asyncio.sleep(period)
        await plane.reap()
        shared.reap()


async def _maintain_cache(cache: ModelCache, executor: ThreadPoolExecutor, config: DaemonConfig) -> None:
    """Drop expired partial uploads and re-hash models due for verification, in the executor."""
    periods = [t / 2 for t in (config.verify_interval_s, config.limits.partial_ttl_s) if t > 0]
    if not periods:
        return
    period = min(60.0, max(0.5, min(periods)))
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period)
        try:
            await loop.run_in_executor(executor, cache.quota.expire_partials)
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


@dataclass(frozen=True)
class _Security:
    """Who may call and over what (tokens, TLS), and what about that the user must hear."""

    tokens: TokenTable | None
    access: AccessPolicy
    credentials: grpc.ServerCredentials | None
    exposed: bool  # a non-loopback listener without authentication (--insecure)
    warnings: tuple[str, ...]

    @classmethod
    def of(cls, config: DaemonConfig) -> _Security:
        tokens = TokenTable.load(config.auth_token_file) if config.auth_token_file else None
        credentials = _server_credentials(config.tls) if config.tls else None
        access = AccessPolicy(
            tokens, config.tls is not None and config.tls.client_ca is not None, config.trust_loopback
        )
        exposure = listen_policy(config.listen, access.required, config.insecure, tls=credentials is not None)
        warnings = list(exposure)
        if config.trust_loopback and access.required:
            warnings.append(
                "--trust-loopback: every process on this machine (and in its network namespace, and adb "
                "users) may call without a token or certificate"
            )
        if config.metrics_listen is not None:
            from rknn_server.protocols.http.endpoint import check_exposure

            warnings += check_exposure(config.metrics_listen, tokens is not None, config.insecure)
        return cls(tokens, access, credentials, bool(exposure), tuple(warnings))

    def kinds(self) -> list[str]:
        """The kinds of credentials callers need (for the start-up log)."""
        kinds = (("token", self.tokens is not None), ("client-certificate", self.access.client_certificates))
        return [kind for kind, on in kinds if on]


def _backend(config: DaemonConfig, probe: PlatformInfo, metrics: DaemonMetrics) -> tuple[Backend, str]:
    """The backend the config asks for (isolated in worker processes with --isolation process), and why."""
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
            models_in_cache=True,
        )
    if config.isolation == "process":
        backend = IsolatedBackend(backend, config.limits.call_timeout_s or None, metrics.worker_lost)
    return backend, reason


class _GenericHandlersOnly:
    """What a generated `add_*_to_server` gives a server, less its registered-method tables.

    grpc.aio keeps one pending task per registered method and, for every call, waits on all of them
    again (`asyncio.wait` over ~40 tasks: rknn.v1, KServe v2, health): a tiny model's call paid more
    for that than for its run. The same handlers served as generic handlers are found by one dict
    lookup per call; what a client sees does not change."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Left out: the generic handler added beside it serves the same methods."""


def _grpc_server(
    config: DaemonConfig,
    security: _Security,
    guard: Guard,
    service: RknnService,
    v2_service: v2.InferenceService,
) -> tuple[grpc.aio.Server, health_aio.HealthServicer, list[str]]:
    """The gRPC server with rknn.v1, KServe v2, health and reflection, behind the guard, bound to --listen."""
    server = grpc.aio.server(
        interceptors=[guard],
        options=[
            ("grpc.max_receive_message_length", config.limits.max_message_bytes),
            ("grpc.max_send_message_length", MAX_RUN_REPLY_BYTES),
            ("grpc.so_reuseport", 0),
            *KEEPALIVE_OPTIONS,
            *HTTP2_OPTIONS,
            *RECEIVE_WINDOW_OPTIONS,
        ],
    )
    handlers = cast(grpc.aio.Server, _GenericHandlersOnly(server))  # duck-typed: the two methods used
    rknn_pb2_grpc.add_RknnServerServicer_to_server(service, handlers)
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(v2_service, handlers)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, handlers)
    from grpc_reflection.v1alpha import reflection

    reflection.enable_server_reflection(
        [
            SERVICE_NAME,
            v2.SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    bound = []
    for address in config.listen:
        port = _add_port(server, address, security.credentials)
        bound.append(address.display(port))
        if address.scheme == "tcp":
            security.access.listeners.append((address.host, port))
    return server, health, bound


def _data_plane(
    config: DaemonConfig,
    limits: Limits,
    backend: Backend,
    metrics: DaemonMetrics,
    reservations: ReservationBook,
) -> DataPlane:
    """The data plane over the model cache and the executor; the reservations keep others' sessions out."""
    cache = ModelCache(config.model_cache, limits.cache())
    if config.verify_cache:
        _verify_cache(cache)
    executor = ThreadPoolExecutor(
        max_workers=max(4, limits.max_sessions, limits.max_inflight_requests), thread_name_prefix="runtime"
    )
    return DataPlane(
        backend,
        cache,
        executor,
        metrics,
        limits.tensors(),
        limits.sessions(),
        limits.memory(),
        reservations.admit,
    )


def _repository(config: DaemonConfig, backend: Backend, limits: Limits) -> ModelRepository | None:
    """KServe v2's model repository (--model-repository), its configs checked now: a bad one stops the start."""
    if config.model_repository is None:
        return None
    repository = ModelRepository(
        config.model_repository, backend.model_suffixes, limits.max_model_bytes, limits.max_model_files
    )
    for name in repository.names():
        repository.read(name)
    return repository


def _announce(config: DaemonConfig, bound: list[str], metrics_url: str, instance_id: str) -> None:
    """Say where the daemon serves: the ready file (--ready-file) and one `listening on` line each."""
    if config.ready_file is not None:
        write_ready_file(
            config.ready_file, ReadyInfo(os.getpid(), __version__, instance_id, bound, metrics_url)
        )
    for text in bound:
        print(listening_line(text), flush=True)
    if metrics_url:
        print(f"metrics on {metrics_url}", flush=True)


async def serve(config: DaemonConfig, ready: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or stdin's end with --exit-with-stdin). Every start step pushes
    its undo on one exit stack, so a start that fails half way (a port taken, a bad repository)
    stops what it had started, in reverse order, as a normal stop does."""
    async with contextlib.AsyncExitStack() as stack:
        await _serve(config, stack, ready)
    log.info("daemon_stopped")
    return 0


async def _serve(config: DaemonConfig, stack: contextlib.AsyncExitStack, ready: asyncio.Event | None) -> None:
    security = _Security.of(config)
    probe = probe_platform(config.sysfs_root)
    legacy_plan = legacy.plan(
        config.legacy_listen,
        bool(probe.npu_device) and config.sysfs_root == Path("/"),
        security.tokens is not None,
    )
    warnings = [*security.warnings, *legacy_plan.warnings]
    if config.limits.call_timeout_s and config.isolation != "process":
        warnings.append(
            "--call-timeout is enforced only with --isolation process (a thread cannot be killed)"
        )
    for text in warnings:
        log.warning("insecure_configuration", warning=text)

    limits = config.enforced_limits()
    raise_open_files(limits.max_toolkit_connections + limits.max_http_connections)
    metrics = DaemonMetrics()
    backend, reason = _backend(config, probe, metrics)
    reservations = ReservationBook()
    plane = _data_plane(config, limits, backend, metrics, reservations)
    stack.callback(plane.shutdown)
    stack.callback(plane.cache.close)
    shared = SharedMemoryRegistry(
        ShmLimits(enabled=config.shm), limits.session_idle_timeout_s, security.access.listeners
    )
    stack.callback(shared.close_all)
    stack.callback(plane.close_all, "daemon shutting down")
    doorbells = Doorbells(plane, shared, metrics)
    if config.shm:
        doorbells.start()
        stack.callback(doorbells.close_all, 0.0)  # at once where the start failed; a no-op after a stop
    # Doorbells first: they let go of the memory of regions the registry then closes (and unmaps).
    plane.on_close.extend([doorbells.session_closed, shared.session_closed])
    facts = ServiceConfig(
        runtime_reason=reason,
        board=probe.board_model,
        auth_required=security.access.required,
        tls=security.credentials is not None,
        insecure=security.exposed,
        warnings=tuple(warnings),
        instance_id=secrets.token_hex(8),
    )
    guard = Guard(security.access, limits, metrics, {**CODECS, **v2.CODECS})
    metrics.watch(
        StateCollector(
            plane.registry.__len__, reservations, lambda: guard.per_client, lambda: guard.refused, plane.cache
        )
    )
    metrics.watch(BoardTelemetry(config.sysfs_root))
    models = V2Models(
        plane, _repository(config, backend, limits), max(1, limits.max_sessions // 2), SystemRegions(shared)
    )
    serving = asyncio.Event()
    server, health, bound = _grpc_server(
        config,
        security,
        guard,
        RknnService(plane, reservations, facts, limits, shared, doorbells),
        v2.InferenceService(models, serving.is_set, limits.max_message_bytes),
    )

    metrics_url, gates = "", []
    if config.metrics_listen is not None:
        # The HTTP door (and KServe v2 over REST) is imported only where --metrics-listen opens it.
        from rknn_server.protocols.http.endpoint import HttpEndpoint, Routes
        from rknn_server.protocols.kserve.rest import RestV2

        routes = Routes(
            metrics.exposition,
            serving.is_set,
            more=RestV2(models, Recorder(metrics), limits.max_message_bytes),
            posts=RestV2.posts,
            max_body_bytes=limits.max_message_bytes,
            body_budget=plane.frame_memory,
        )
        # The gRPC doors' access rule, less client certificates (this listener has no TLS).
        endpoint = HttpEndpoint(
            routes, replace(security.access, client_certificates=False), limits.http_connections()
        )
        gates.append(endpoint.gate)
        http_server, http_port = await endpoint.start(config.metrics_listen)
        stack.callback(http_server.close)
        metrics_url = config.metrics_listen.display(http_port).replace("tcp://", "http://", 1) + "/metrics"
    # Stop signals are handled before the daemon says it is ready: a SIGTERM right after the
    # `listening on` lines (or the ready file) is a clean stop.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
        stack.callback(loop.remove_signal_handler, sig)
    await server.start()

    async def drain() -> None:
        """Calls in flight and doorbell frames in flight finish within the grace period, side by side."""
        await asyncio.gather(
            server.stop(config.grace_s), asyncio.to_thread(doorbells.close_all, config.grace_s)
        )

    stack.push_async_callback(drain)
    legacy_limits = LegacyLimits(
        limits.tensors(), limits.max_model_bytes, limits.max_message_bytes, limits.toolkit_connections()
    )
    legacy_listener, legacy_bound = await legacy.start(
        legacy_plan, plane, legacy_limits, RELEASES[config.legacy_toolkit]
    )
    stack.push_async_callback(legacy_listener.close)
    metrics.watch(GateCollector([legacy_listener.gate, *gates]))
    bound += [f"{place} (RKNN-Toolkit2 protocol)" for place in legacy_bound]
    await models.load_all()
    for status_name in ("", SERVICE_NAME):
        await health.set(status_name, health_pb2.HealthCheckResponse.SERVING)
    serving.set()
    if config.ready_file is not None:
        stack.callback(config.ready_file.unlink, missing_ok=True)
    _announce(config, bound, metrics_url, facts.instance_id)
    log.info(
        "daemon_started",
        version=__version__,
        runtime=backend.name,
        reason=reason,
        listen=bound,
        metrics=metrics_url or None,
        soc=backend.soc(),
        auth=security.kinds(),
        trust_loopback=config.trust_loopback,
        tls=security.credentials is not None,
        instance=facts.instance_id,
    )

    if config.exit_with_stdin:
        threading.Thread(target=_wait_stdin_eof, args=(loop, stop), daemon=True).start()
    for task in (
        asyncio.create_task(_reap(plane, shared, min(1.0, limits.session_idle_timeout_s / 4))),
        asyncio.create_task(_maintain_cache(plane.cache, plane.executor, config)),
    ):
        stack.callback(task.cancel)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("daemon_stopping", grace_s=config.grace_s, sessions=len(plane.registry))
    serving.clear()  # /v2/health/ready answers 503 while the calls in flight finish
    await health.enter_graceful_shutdown()


def run(config: DaemonConfig) -> int:
    """Run the daemon on uvloop when it is installed (it has no armv7 wheels), else asyncio."""
    reuse_large_buffers()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config))
    if sys.version_info >= (3, 11):
        return uvloop.run(serve(config))
    uvloop.install()
    return asyncio.run(serve(config))
