"""`rknn_server [serve] [options]` runs the daemon; `rknn_server health [ADDR]` probes one."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from dataclasses import fields
from pathlib import Path

from rknn_proto.version import DEFAULT_PORT
from rknn_server import __version__
from rknn_server.config.daemon_config import DaemonConfig
from rknn_server.config.limits import Limits
from rknn_server.config.listen import DEFAULT_LISTEN, ListenAddress, parse_listen, parse_metrics_listen
from rknn_server.config.options import CONFIG_ENV, YEAR_S, Bounded, Repeat, document, env_name, parse_layered
from rknn_server.protocols.legacy.layouts import DEFAULT_VERSION, RELEASES

# Only what the parsers need is imported here: `--help`, a refused option and `health` never load the
# daemon (its imports cost a board's CPU seconds); serve_main imports it once the options are good.


def _listen_arg(text: str) -> str:
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


USAGE = "rknn_server [serve] [OPTION ...]\n       rknn_server health [ADDR] [OPTION ...]"
COMMANDS = ("serve", "health")


def _metrics_listen_arg(text: str) -> ListenAddress:
    try:
        return parse_metrics_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_limit_flags(group: argparse._ArgumentGroup, cache: bool) -> None:
    """The flags of the Limits fields of one --help group, each from its field (server/config/limits.py): its
    name, default (the memory budgets sized to this machine), range and help."""
    defaults = Limits.for_machine()
    for limit in Limits.flags():
        if limit.cache == cache:
            group.add_argument(
                limit.flag,
                dest=limit.name,
                type=limit.bounds,
                default=getattr(defaults, limit.name),
                metavar=limit.metavar,
                help=limit.help,
            )


def serve_parser() -> argparse.ArgumentParser:
    """The daemon's options, grouped by topic. A new option is one add_argument call in its group (plus
    its DaemonConfig field in daemon_config): its environment variable, config-file key and the default
    shown in --help come from server/config/options.py."""
    p = argparse.ArgumentParser(
        prog="rknn_server",
        usage=USAGE,
        description="Board daemon: lets a PC run, profile and inspect models on this board's NPU over gRPC. "
        "Commands: serve (the default) runs the daemon; health probes one (see 'rknn_server health --help').",
        epilog="Every option can also be set by the environment variable shown beside it "
        "(RKNN_SERVER_LISTEN takes a comma list) or by a key named like the long option in the TOML file "
        f'of --config (or ${CONFIG_ENV}), e.g. cache-quota = "16GiB" or listen = ["tcp://0.0.0.0:50515"]. '
        "The command line wins over the environment, which wins over the file. Sizes take bytes or units "
        "(512MiB, 16GiB); S is seconds. A number outside the range shown beside its option stops the daemon "
        "before it starts, naming the option, where the value came from and the range.",
    )
    p.add_argument("--version", action="version", version=f"rknn_server {__version__}")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"TOML file of option defaults, keys named like the long options (env {CONFIG_ENV})",
    )

    security = p.add_argument_group(
        "listeners and security",
        "A TCP listener on a non-loopback address needs --auth-token-file or mutual TLS (--tls-client-ca), "
        "or an explicit --insecure; TLS without a client CA encrypts but authenticates nobody. Once a token "
        "file or a client CA is given, every caller on every listener needs it, loopback and adb included, "
        "unless --trust-loopback. Without either, loopback and the abstract socket are open to every local user.",
    )
    security.add_argument(
        "--listen",
        action=Repeat,
        type=_listen_arg,
        default=list(DEFAULT_LISTEN),
        metavar="ADDR",
        help="tcp://HOST:PORT or unix-abstract:NAME; repeatable; port 0 picks a free port",
    )
    security.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="tokens clients must send (lines 'name:token' or one bare token); metadata "
        "'authorization: Bearer T' (default: none)",
    )
    security.add_argument(
        "--trust-loopback",
        action="store_true",
        help="let callers on this machine (loopback, the abstract socket, so adb forward too) in without a "
        "token or certificate: every local user and process, and anyone in its network namespace, can then "
        "load models and run code here; a wrong token is still refused",
    )
    security.add_argument("--auth-loopback", action="store_true", help=argparse.SUPPRESS)  # deprecated no-op
    security.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="serve TLS on TCP with this certificate (default: none)"
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
    security.add_argument(
        "--legacy-listen",
        action=Repeat,
        default=[],
        metavar="PLACE",
        help="serve the unmodified RKNN-Toolkit2's own protocol on unix:/PATH or unix-abstract:NAME; repeatable "
        "(default on a board: unix:/dev/socket/transfer_proxy and unix-abstract:transfer_proxy; no authentication, "
        "never TCP; off by default when --auth-token-file is given)",
    )
    security.add_argument(
        "--shm",
        choices=("on", "off"),
        default="on",
        help="let callers on this host (loopback TCP, their user named by the kernel) pass tensors "
        "through files in /dev/shm they own instead of the wire (docs/shared-memory.md)",
    )
    security.add_argument("--no-legacy", action="store_true", help="do not serve the RKNN-Toolkit2 protocol")
    security.add_argument(
        "--legacy-toolkit-version",
        choices=sorted(RELEASES),
        default=DEFAULT_VERSION,
        help="the RKNN-Toolkit2 release whose message layout the legacy listener speaks (its clients send no "
        "version; a client of another layout is refused with a crash report naming this option; default "
        "%(default)s)",
    )
    security.add_argument(
        "--metrics-listen",
        type=_metrics_listen_arg,
        metavar="ADDR",
        help="serve Prometheus /metrics and /v2/health/{live,ready} over HTTP on tcp://HOST:PORT "
        "(default: off; a non-loopback address needs --auth-token-file or --insecure)",
    )

    cache = p.add_argument_group(
        "model cache",
        "Everything on disk counts against --cache-quota: models, uploads in progress and abandoned "
        "partial uploads; a new upload evicts the least recently used of them first.",
    )
    cache.add_argument(
        "--model-cache",
        type=Path,
        default=Path("~/.cache/rknn_server").expanduser(),
        metavar="DIR",
        help="model cache folder",
    )
    cache.add_argument(
        "--model-repository",
        type=Path,
        metavar="DIR",
        help="KServe v2 model repository: one folder per model (its file(s) and an optional config.toml), "
        "served by folder name beside the uploaded models (default: none)",
    )
    add_limit_flags(cache, cache=True)
    cache.add_argument(
        "--verify-interval",
        type=Bounded("seconds", 0, YEAR_S),
        default=DaemonConfig.verify_interval_s,
        metavar="S",
        help="re-hash every cached model every S s and remove the damaged ones (0: only when a file's "
        "size, mtime or inode changed)",
    )
    cache.add_argument(
        "--verify-cache",
        action="store_true",
        help="at start-up, before serving, re-hash every cached model, remove and log the damaged ones, "
        "then go on serving",
    )

    limits = p.add_argument_group(
        "sessions and limits",
        "A request beyond a limit gets RESOURCE_EXHAUSTED naming it; GetInfo reports every limit "
        "(`rknn-client info` shows them).",
    )
    limits.add_argument(
        "--isolation",
        choices=("thread", "process"),
        default=DaemonConfig.isolation,
        help="run each session in the daemon (thread) or in a worker process of its own (process)",
    )
    add_limit_flags(limits, cache=False)
    limits.add_argument(
        "--grace",
        type=Bounded("seconds", 0, YEAR_S),
        default=DaemonConfig.grace_s,
        metavar="S",
        help="on SIGTERM, let calls finish for S s",
    )

    runtime = p.add_argument_group("runtime")
    runtime.add_argument(
        "--runtime", choices=("auto", "host", "rknnrt"), default=DaemonConfig.runtime, help="runtime backend"
    )
    runtime.add_argument(
        "--soc",
        default=DaemonConfig.soc,
        help="declare the SoC (e.g. rk3588) when the probe cannot see it (default: probed)",
    )
    runtime.add_argument(
        "--runtime-lib",
        type=Path,
        metavar="PATH",
        help="librknnrt.so/librknnmrt.so to load (default: searched in the system's library folders)",
    )
    runtime.add_argument(
        "--plugin-dir",
        type=Path,
        metavar="DIR",
        help="custom-op plugins for the rknnrt runtime (default: none)",
    )
    runtime.add_argument(
        "--sysfs-root",
        type=Path,
        default=DaemonConfig.sysfs_root,
        metavar="DIR",
        help="where the board probe reads /proc, /sys and /dev",
    )
    runtime.add_argument(
        "--threads",
        type=Bounded("count", 1, 1024),
        metavar="N",
        help="CPU threads per host-runtime session (default: ONNX Runtime's choice)",
    )
    runtime.add_argument(
        "--backend",
        default=DaemonConfig.backend,
        metavar="MODULE:CALLABLE",
        help="serve with the Backend this factory returns instead of --runtime (out-of-tree runtimes, "
        "tests; default: none)",
    )
    runtime.add_argument(
        "--ready-file",
        type=Path,
        metavar="FILE",
        help="once serving, write JSON here (atomically): the listeners with their bound ports, pid, version, "
        "instance id; removed on a clean stop (default: none)",
    )
    runtime.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="stop when standard input closes (used by a client that starts a private daemon)",
    )

    logging = p.add_argument_group("logging")
    logging.add_argument(
        "--log-format", choices=("console", "json"), default="console", help="log line format"
    )
    logging.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="least severe level logged",
    )
    document(p)
    return p


def health_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rknn_server health",
        description="Probe a daemon's gRPC health service: prints its status and exits 0 when it is "
        "SERVING, 1 when it is not or does not answer. Meant for container health checks and scripts.",
    )
    p.add_argument(
        "addr",
        nargs="?",
        default=f"tcp://127.0.0.1:{DEFAULT_PORT}",
        type=_listen_arg,
        metavar="ADDR",
        help="tcp://HOST:PORT or unix-abstract:NAME (default: %(default)s)",
    )
    p.add_argument(
        "--timeout", type=float, default=3.0, metavar="S", help="give up after S s (default: %(default)g s)"
    )
    tls = p.add_argument_group("TLS", "Speak TLS when a CA is given; the certificate and key make it mutual.")
    for flag, role in (
        ("--tls-ca", "trust this CA for the daemon's certificate"),
        ("--tls-cert", "present this client certificate"),
        ("--tls-key", "private key of --tls-cert"),
    ):
        variable = env_name(flag)
        tls.add_argument(
            flag,
            type=Path,
            default=os.environ.get(variable) or None,
            metavar="PEM",
            help=f"{role} (default: ${variable}, else none)",
        )
    return p


def health_main(argv: list[str]) -> int:
    args = health_parser().parse_args(argv)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

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


def _command(argv: list[str]) -> tuple[str, list[str]]:
    """The subcommand and its arguments; no command word means serve. A word that is no command is
    refused with the closest one rather than as an unexpected argument to serve."""
    if argv[:1] and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if argv[:1] and not argv[0].startswith("-"):
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"usage: {USAGE}\nrknn_server: error: unknown command {argv[0]!r}{hint}", file=sys.stderr)
        raise SystemExit(2)
    return "serve", argv


def main(argv: list[str] | None = None) -> int:
    command, argv = _command(sys.argv[1:] if argv is None else argv)
    if command == "health":
        return health_main(argv)
    return serve_main(argv)


def serve_main(argv: list[str]) -> int:
    parser = serve_parser()
    args = parse_layered(parser, argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.no_legacy and args.legacy_listen:
        parser.error("--no-legacy and --legacy-listen contradict each other")
    from rknn_server.protocols.legacy.listener import parse_place

    for place in args.legacy_listen or ():
        try:
            parse_place(place)
        except ValueError as exc:
            parser.error(str(exc))
    if args.tls_client_ca is not None and args.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    import structlog

    from rknn_server.daemon import run
    from rknn_server.kit.auth import SecurityConfigError
    from rknn_server.observe.logs import configure
    from rknn_server.protocols.kserve.repository import RepositoryError
    from rknn_server.runtime.select import BackendUnavailable

    configure(args.log_format, args.log_level)
    if args.auth_loopback:
        structlog.get_logger("rknn_server").warning(
            "deprecated_option",
            warning="--auth-loopback is deprecated and does nothing: loopback callers need the token "
            "whenever a token file or client CA is configured (--trust-loopback opens loopback)",
        )
    try:
        return run(daemon_config(args))
    except (BackendUnavailable, SecurityConfigError, RepositoryError, OSError) as exc:
        print(f"rknn_server: {exc}", file=sys.stderr)
        return 2


def daemon_config(args: argparse.Namespace) -> DaemonConfig:
    """The daemon's settings from the parsed options (each limit's flag has its field's name as dest)."""
    from rknn_server.kit.auth import TlsFiles

    return DaemonConfig(
        listen=[parse_listen(a) for a in args.listen],
        runtime=args.runtime,
        soc=args.soc.lower(),
        model_cache=args.model_cache,
        model_repository=args.model_repository,
        limits=Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)}),
        verify_interval_s=args.verify_interval,
        verify_cache=args.verify_cache,
        isolation=args.isolation,
        threads=args.threads,
        exit_with_stdin=args.exit_with_stdin,
        runtime_lib=args.runtime_lib,
        plugin_dir=args.plugin_dir,
        sysfs_root=args.sysfs_root,
        grace_s=args.grace,
        auth_token_file=args.auth_token_file,
        trust_loopback=args.trust_loopback,
        tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None,
        insecure=args.insecure,
        backend=args.backend,
        metrics_listen=args.metrics_listen,
        ready_file=args.ready_file,
        legacy_listen=() if args.no_legacy else (tuple(args.legacy_listen) if args.legacy_listen else None),
        legacy_toolkit=args.legacy_toolkit_version,
        shm=args.shm == "on",
    )


if __name__ == "__main__":
    sys.exit(main())
