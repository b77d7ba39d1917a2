"""`rknn_server [serve] [options]` runs the daemon; `rknn_server health [ADDR]` probes one."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rknn_proto import codec
from rknn_proto.version import DEFAULT_PORT, MAX_MESSAGE_BYTES
from rknn_server import __version__
from rknn_server.auth import SecurityConfigError, TlsFiles
from rknn_server.daemon import DaemonConfig, run
from rknn_server.legacy.listener import parse_place
from rknn_server.listen import DEFAULT_LISTEN, parse_listen
from rknn_server.logs import configure
from rknn_server.model_cache import CacheLimits
from rknn_server.runtime.select import BackendUnavailable


def _listen_arg(text: str) -> str:
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rknn_server",
        description="Board daemon: lets a PC run, profile and inspect models on this board's NPU over gRPC.",
        epilog="Subcommand: 'rknn_server health [ADDR]' exits 0 when the daemon at ADDR is serving.",
    )
    p.add_argument("--version", action="version", version=f"rknn_server {__version__}")
    p.add_argument(
        "--listen",
        action="append",
        type=_listen_arg,
        metavar="ADDR",
        help="tcp://HOST:PORT or unix-abstract:NAME; repeatable; port 0 picks a free port "
        f"(default: {' and '.join(DEFAULT_LISTEN)})",
    )
    p.add_argument(
        "--legacy-listen",
        action="append",
        metavar="PLACE",
        help="serve the unmodified RKNN-Toolkit2's own protocol on unix:/PATH or unix-abstract:NAME; repeatable "
        "(default on a board: unix:/dev/socket/transfer_proxy and unix-abstract:transfer_proxy; no authentication, "
        "never TCP; off by default when --auth-token-file is given)",
    )
    p.add_argument("--no-legacy", action="store_true", help="do not serve the RKNN-Toolkit2 protocol")
    p.add_argument("--runtime", choices=("auto", "host", "rknnrt"), default="auto", help="runtime backend")
    p.add_argument("--soc", default="", help="declare the SoC (e.g. rk3588) when the probe cannot see it")
    p.add_argument(
        "--runtime-lib", type=Path, default=None, metavar="PATH", help="librknnrt.so/librknnmrt.so to load"
    )
    p.add_argument(
        "--plugin-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="custom-op plugins for the rknnrt runtime",
    )
    p.add_argument(
        "--sysfs-root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="where the board probe reads /proc, /sys and /dev (default: /)",
    )
    p.add_argument(
        "--model-cache",
        type=Path,
        default=Path("~/.cache/rknn_server").expanduser(),
        help="model cache folder",
    )
    p.add_argument(
        "--cache-quota", type=int, default=CacheLimits.quota_bytes, help="model cache size in bytes"
    )
    p.add_argument(
        "--max-model-bytes", type=int, default=CacheLimits.max_model_bytes, help="largest model accepted"
    )
    p.add_argument(
        "--session-idle-timeout", type=float, default=300.0, metavar="S", help="free idle sessions after S s"
    )
    p.add_argument("--max-sessions", type=int, default=16, help="most sessions open at once")
    p.add_argument(
        "--isolation",
        choices=("thread", "process"),
        default="thread",
        help="run each session in the daemon (thread) or in a worker process of its own (process)",
    )
    p.add_argument(
        "--call-timeout", type=float, default=None, metavar="S", help="kill a session's worker after S s"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads per host-runtime session")
    p.add_argument(
        "--backend",
        default="",
        metavar="MODULE:CALLABLE",
        help="serve with the Backend this factory returns instead of --runtime (out-of-tree runtimes, tests)",
    )
    p.add_argument(
        "--grace", type=float, default=10.0, metavar="S", help="on SIGTERM, let calls finish for S s"
    )
    security = p.add_argument_group(
        "security",
        "A TCP listener on a non-loopback address needs --auth-token-file or TLS, or an explicit --insecure. "
        "Loopback and the abstract socket (adb) stay open unless --auth-loopback.",
    )
    security.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="tokens clients must send (lines 'name:token' or one bare token); metadata 'authorization: Bearer T'",
    )
    security.add_argument(
        "--auth-loopback", action="store_true", help="require the token from loopback and adb callers too"
    )
    security.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="serve TLS on TCP with this certificate"
    )
    security.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    security.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="require client certificates signed by this CA (mTLS)",
    )
    security.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback listener without token or TLS (warns)"
    )
    limits = p.add_argument_group("limits", "a request beyond one gets RESOURCE_EXHAUSTED naming it")
    defaults = codec.TensorLimits()
    limits.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=0,
        help="sessions one client may hold (0: --max-sessions)",
    )
    limits.add_argument("--max-inflight-requests", type=int, default=64, help="calls served at once")
    limits.add_argument(
        "--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES, help="largest gRPC message"
    )
    limits.add_argument(
        "--max-chunk-bytes", type=int, default=defaults.max_chunk_bytes, help="largest tensor or upload chunk"
    )
    limits.add_argument(
        "--max-tensor-bytes", type=int, default=defaults.max_tensor_bytes, help="largest tensor"
    )
    limits.add_argument("--max-tensor-rank", type=int, default=defaults.max_rank, help="highest tensor rank")
    limits.add_argument(
        "--max-tensor-elements", type=int, default=defaults.max_elements, help="most elements in a tensor"
    )
    p.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="stop when standard input closes (used by a client that starts a private daemon)",
    )
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def health_main(argv: list[str]) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    p = argparse.ArgumentParser(
        prog="rknn_server health", description="Exit 0 when the daemon at ADDR is serving."
    )
    p.add_argument("addr", nargs="?", default=f"tcp://127.0.0.1:{DEFAULT_PORT}", type=_listen_arg)
    p.add_argument("--timeout", type=float, default=3.0)
    p.add_argument(
        "--tls-ca",
        type=Path,
        default=os.environ.get("RKNN_SERVER_TLS_CA") or None,
        help="speak TLS, trusting this CA (default: $RKNN_SERVER_TLS_CA)",
    )
    p.add_argument("--tls-cert", type=Path, default=os.environ.get("RKNN_SERVER_TLS_CERT") or None)
    p.add_argument("--tls-key", type=Path, default=os.environ.get("RKNN_SERVER_TLS_KEY") or None)
    args = p.parse_args(argv)
    target = parse_listen(args.addr).grpc_address()
    if args.tls_ca is not None:
        credentials = grpc.ssl_channel_credentials(
            args.tls_ca.read_bytes(),
            args.tls_key.read_bytes() if args.tls_key else None,
            args.tls_cert.read_bytes() if args.tls_cert else None,
        )
        channel = grpc.secure_channel(target, credentials)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"rknn_server at {args.addr} is not answering: {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"rknn_server at {args.addr}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["health"]:
        return health_main(argv[1:])
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    parser = serve_parser()
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.no_legacy and args.legacy_listen:
        parser.error("--no-legacy and --legacy-listen contradict each other")
    for place in args.legacy_listen or ():
        try:
            parse_place(place)
        except ValueError as exc:
            parser.error(str(exc))
    if args.tls_client_ca is not None and args.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    configure(args.log_format, args.log_level)
    config = DaemonConfig(
        listen=[parse_listen(a) for a in (args.listen or DEFAULT_LISTEN)],
        runtime=args.runtime,
        soc=args.soc.lower(),
        model_cache=args.model_cache,
        cache_limits=CacheLimits(quota_bytes=args.cache_quota, max_model_bytes=args.max_model_bytes),
        session_idle_timeout_s=args.session_idle_timeout,
        max_sessions=args.max_sessions,
        isolation=args.isolation,
        call_timeout_s=args.call_timeout,
        threads=args.threads,
        exit_with_stdin=args.exit_with_stdin,
        runtime_lib=args.runtime_lib,
        plugin_dir=args.plugin_dir,
        sysfs_root=args.sysfs_root,
        tensor_limits=codec.TensorLimits(
            max_tensor_bytes=args.max_tensor_bytes,
            max_rank=args.max_tensor_rank,
            max_elements=args.max_tensor_elements,
            max_chunk_bytes=args.max_chunk_bytes,
        ),
        max_sessions_per_client=args.max_sessions_per_client,
        max_inflight_requests=args.max_inflight_requests,
        max_message_bytes=args.max_message_bytes,
        grace_s=args.grace,
        auth_token_file=args.auth_token_file,
        auth_loopback=args.auth_loopback,
        tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None,
        insecure=args.insecure,
        backend=args.backend,
        legacy_listen=() if args.no_legacy else (tuple(args.legacy_listen) if args.legacy_listen else None),
    )
    try:
        return run(config)
    except (BackendUnavailable, SecurityConfigError, OSError) as exc:
        print(f"rknn_server: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
