"""The daemon: one grpc.aio server on one event loop, with health, reflection, the session reaper,
the guard (tokens, in-flight limit), TLS, and graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
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
from rknn_proto.version import MAX_MESSAGE_BYTES
from rknn_server import __version__
from rknn_server.auth import TlsFiles, TokenTable, listen_policy
from rknn_server.guard import Guard
from rknn_server.legacy import startup as legacy
from rknn_server.legacy.connection import LegacyLimits
from rknn_server.listen import DEFAULT_LISTEN, ListenAddress, parse_listen
from rknn_server.model_cache import CacheLimits, ModelCache
from rknn_server.platform import probe_platform
from rknn_server.runtime.backend_hook import load_backend
from rknn_server.runtime.base import Backend, ModelRuntime, RuntimeOptions
from rknn_server.runtime.isolated import IsolatedRuntime
from rknn_server.runtime.select import select_backend
from rknn_server.service import RknnService, ServiceConfig
from rknn_server.sessions import Session, SessionRegistry

log = structlog.get_logger("rknn_server")
SERVICE_NAME = rknn_pb2.DESCRIPTOR.services_by_name["RknnServer"].full_name


@dataclass
class DaemonConfig:
    listen: list[ListenAddress] = field(default_factory=lambda: [parse_listen(a) for a in DEFAULT_LISTEN])
    runtime: str = "auto"
    soc: str = ""
    model_cache: Path = field(default_factory=lambda: Path("~/.cache/rknn_server").expanduser())
    cache_limits: CacheLimits = field(default_factory=CacheLimits)
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
    auth_loopback: bool = False  # require the token from loopback callers too
    tls: TlsFiles | None = None
    insecure: bool = False
    backend: str = ""  # MODULE:CALLABLE serving instead of `runtime` (see runtime/backend_hook.py)
    # Where the RKNN-Toolkit2 protocol is served (server/legacy): None = the default, () = off.
    legacy_listen: tuple[str, ...] | None = None


def _same(backend: Backend) -> Backend:
    return backend


def make_opener(config: DaemonConfig):  # type: ignore[no-untyped-def]
    """How sessions load models: in this process, or each in a worker process of its own."""

    def in_process(backend: Backend, path: Path, options: RuntimeOptions) -> ModelRuntime:
        return backend.open(path, options)

    def in_worker(backend: Backend, path: Path, options: RuntimeOptions) -> ModelRuntime:
        return IsolatedRuntime(functools.partial(_same, backend), path, options, config.call_timeout_s)

    return in_worker if config.isolation == "process" else in_process


async def _reap(registry: SessionRegistry, executor: ThreadPoolExecutor, period: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period)
        for session in registry.expired():
            await loop.run_in_executor(executor, registry.close, session, "idle lease expired")


def _wait_stdin_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    while sys.stdin.buffer.read(1 << 16):
        pass
    loop.call_soon_threadsafe(stop.set)


def _server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    cert, key, client_ca = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


async def serve(config: DaemonConfig, ready: asyncio.Event | None = None) -> int:
    tokens = TokenTable.load(config.auth_token_file) if config.auth_token_file else None
    credentials = _server_credentials(config.tls) if config.tls else None
    exposure = listen_policy(config.listen, tokens is not None or credentials is not None, config.insecure)
    warnings = list(exposure)
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
    executor = ThreadPoolExecutor(
        max_workers=max(4, config.max_sessions, config.max_inflight_requests), thread_name_prefix="runtime"
    )

    def on_release(session: Session) -> None:
        cache.unpin(session.digest)

    registry = SessionRegistry(
        config.max_sessions, config.session_idle_timeout_s, on_release, config.max_sessions_per_client
    )
    service = RknnService(
        backend,
        cache,
        registry,
        executor,
        make_opener(config),
        ServiceConfig(
            tensor_limits=config.tensor_limits,
            runtime_reason=reason,
            board=probe.board_model,
            max_message_bytes=config.max_message_bytes,
            max_inflight_requests=config.max_inflight_requests,
            call_timeout_s=(config.call_timeout_s or 0.0) if config.isolation == "process" else 0.0,
            auth_required=tokens is not None,
            tls=credentials is not None,
            insecure=bool(exposure),
            warnings=tuple(warnings),
            instance_id=secrets.token_hex(8),
        ),
    )
    server = grpc.aio.server(
        interceptors=[Guard(tokens, config.auth_loopback, config.max_inflight_requests)],
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    rknn_pb2_grpc.add_RknnServerServicer_to_server(service, server)
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    from grpc_reflection.v1alpha import reflection

    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    bound = []
    for address in config.listen:
        if credentials is not None and address.scheme == "tcp":
            port = server.add_secure_port(address.grpc_address(), credentials)
        else:
            port = server.add_insecure_port(address.grpc_address())
        if address.scheme == "tcp" and port == 0:
            raise OSError(f"cannot listen on {address.display()}: the address is in use or not available")
        bound.append(address.display(port))
    await server.start()
    legacy_limits = LegacyLimits(
        config.tensor_limits, config.cache_limits.max_model_bytes, config.max_message_bytes
    )
    legacy_listener, legacy_bound = await legacy.start(legacy_plan, service.plane, legacy_limits)
    bound += [f"{place} (RKNN-Toolkit2 protocol)" for place in legacy_bound]
    for status_name in ("", SERVICE_NAME):
        await health_servicer.set(status_name, health_pb2.HealthCheckResponse.SERVING)
    for text in bound:
        print(f"listening on {text}", flush=True)
    log.info(
        "daemon_started",
        version=__version__,
        runtime=backend.name,
        reason=reason,
        listen=bound,
        soc=backend.soc(),
        auth="token" if tokens else "none",
        tls=credentials is not None,
        instance=service.config.instance_id,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.exit_with_stdin:
        threading.Thread(target=_wait_stdin_eof, args=(loop, stop), daemon=True).start()
    reaper = asyncio.create_task(_reap(registry, executor, min(1.0, config.session_idle_timeout_s / 4)))
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("daemon_stopping", grace_s=config.grace_s, sessions=len(registry))
    await health_servicer.enter_graceful_shutdown()
    await server.stop(config.grace_s)
    await legacy_listener.close()
    reaper.cancel()
    for session in registry.drain():
        registry.close(session, "daemon shutting down")
    executor.shutdown(wait=False, cancel_futures=True)
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
