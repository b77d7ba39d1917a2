"""`rknn-client doctor`: walk the chain from this PC to the board's NPU and name the first broken link.

Each link is a Check; the walk stops at the first failed blocking check, whose `fix` says what to do.
Non-blocking checks (warnings) are reported and the walk goes on.
"""

from __future__ import annotations

import socket
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import adbutils

from rknn_client.boards.shell import BoardShell
from rknn_client.device import Device
from rknn_client.errors import AuthenticationFailed, RknnError
from rknn_client.negotiate import check_versions
from rknn_client.transport.adb import (
    AdbTransportError,
    adb_server_address,
    adb_server_running,
    find_device,
    open_adb,
    require_ready,
)
from rknn_client.transport.base import Endpoint, TransportError
from rknn_client.transport.security import ENV_TOKEN
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import rknn_pb2
from rknn_proto.version import (
    DEFAULT_ABSTRACT_SOCKET,
    DEFAULT_PORT,
    PROTOCOL_VERSION,
)

# Where RKNPU2 images install the closed rknn_server and the scripts that respawn it.
VENDOR_DIRS = ("/usr/bin", "/oem/usr/bin")
VENDOR_SCRIPTS = tuple(
    f"{folder}/{name}" for folder in VENDOR_DIRS for name in ("start_rknn.sh", "restart_rknn.sh")
)
VENDOR_BINARY_SUFFIX = "/usr/bin/rknn_server"
VENDOR_FIX = (
    "stop it with `adb shell killall rknn_server`, keep it from coming back with "
    f"`adb shell chmod -x {' '.join(VENDOR_SCRIPTS)}` (ignore the paths that do not exist) "
    "and remove its line from the board's init scripts (/etc/init.d, or the Android init .rc)"
)
# This project's daemon on a board: the `rknn_server` console script, which runs as
# `.../python .../rknn_server serve` (so `pidof rknn_server` does not see it), or a binary of that name.
# Lists "PID EXE" for each; the shell running this has argv[0] `sh` and so never lists itself.
_FIND_DAEMONS = (
    "for d in /proc/[0-9]*; do set -f; set -- $(tr '\\0' ' ' 2>/dev/null <$d/cmdline); set +f; "
    'case "${1##*/}" in rknn_server) ;; python*) [ "${2##*/}" = rknn_server ] || continue;; *) continue;; esac; '
    'echo "${d#/proc/} $(readlink $d/exe)"; done'
)
TOKEN_FIX = (
    f"the daemon wants a bearer token: set {ENV_TOKEN} (or pass --token) to a line of the file the daemon "
    f"was started with (`--auth-token-file`), as it stands (`name:token` or a bare token): for a one-token "
    f"file, `export {ENV_TOKEN}=$(cat auth-token)`"
)
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
# RKNN-Toolkit2's own path to the board: `ps -A | grep rknn_server` (else it runs /usr/bin/rknn_server),
# then adb forwards local:transfer_proxy, served at one of these sockets.
TOOLKIT_LAUNCHER = "/usr/bin/rknn_server"
LEGACY_SOCKETS = ("@transfer_proxy", "/dev/socket/transfer_proxy")
_TOOLKIT_PROBE = (
    f"echo launcher=$([ -x {TOOLKIT_LAUNCHER} ] && head -c 2 {TOOLKIT_LAUNCHER})"
    "; echo named=$(ps -A 2>/dev/null | grep -w rknn_server | grep -v grep | head -n 1)"
    "; echo sockets=$(awk '{print $NF}' /proc/net/unix | grep -Fx"
    + "".join(f" -e {name}" for name in LEGACY_SOCKETS)
    + " | sort -u)"
)
NPU_NODES = ("/dev/dri/renderD129", "/dev/rknpu")
DRIVER_VERSION_FILES = ("/sys/kernel/debug/rknpu/version", "/sys/module/rknpu/version")


@dataclass(frozen=True)
class Check:
    """One link of the chain: whether it holds, what was seen, and how to fix it when not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    # A failed blocking check ends the walk: the links after it cannot be tested.
    blocking: bool = True


def diagnose(
    device_id: str | None,
    *,
    socket_name: str = DEFAULT_ABSTRACT_SOCKET,
    timeout: float = 5.0,
    token: str | None = None,
) -> list[Check]:
    """Check every link to the daemon named by `device_id` (adb serial, IP:PORT, tcp://HOST:PORT or None).

    The daemon is asked with the credentials every other command uses (`token`, else RKNN_SERVER_TOKEN,
    and the RKNN_SERVER_TLS_* files)."""
    if device_id is not None and device_id.startswith("tcp://"):
        walk = _tcp_chain(device_id, timeout, token)
    else:
        walk = _adb_chain(device_id, socket_name, timeout, token)
    checks: list[Check] = []
    for check in walk:
        checks.append(check)
        if check.blocking and not check.ok:
            break
    return checks


def format_report(checks: list[Check]) -> str:
    """A human-readable report, one line per check, the fix under each failed one."""
    lines = []
    for check in checks:
        mark = "OK" if check.ok else ("FAIL" if check.blocking else "WARN")
        lines.append(f"[{mark:>4}] {check.name}: {check.detail}")
        if not check.ok and check.fix:
            lines.append(f"       fix: {check.fix}")
    if checks and checks[-1].blocking and not checks[-1].ok:
        lines.append("Stopped at the first broken link; fix it and run doctor again.")
    elif checks:
        lines.append("Every link holds.")
    return "\n".join(lines)


def _adb_chain(device_id: str | None, socket_name: str, timeout: float, token: str | None) -> Iterator[Check]:
    host, port = adb_server_address()
    if not adb_server_running(host, port):
        yield Check(
            "adb server",
            False,
            f"no adb server answers on {host}:{port}",
            f"start one with `adb -P {port} start-server` "
            "(or set ANDROID_ADB_SERVER_PORT to your server's port)",
        )
        return
    yield Check("adb server", True, f"answers on {host}:{port}")
    client = adbutils.AdbClient(host=host, port=port)
    try:
        info = find_device(client, device_id)
    except AdbTransportError as error:
        yield Check("adb device", False, error.problem, error.fix)
        return
    yield Check("adb device", True, f"{info.serial}{f' ({info.model})' if info.model else ''}")
    try:
        require_ready(info)
    except AdbTransportError as error:
        yield Check("device state", False, error.problem, error.fix)
        return
    yield Check("device state", True, "device (online and authorized)")
    board = BoardShell(client.device(info.serial))
    yield from _daemon_process_checks(board, socket_name)
    try:
        endpoint = open_adb(info.serial, socket_name=socket_name)
    except AdbTransportError as error:
        yield Check("adb forward", False, error.problem, error.fix)
        return
    daemon = yield from _daemon_checks(endpoint, info.serial, timeout, token)
    if daemon is None:
        return
    nodes = board.output(f"ls {' '.join(NPU_NODES)} 2>/dev/null").split()
    yield Check(
        "NPU device node",
        bool(nodes),
        ", ".join(nodes) if nodes else f"none of {', '.join(NPU_NODES)} exists",
        "the RKNPU kernel driver is not loaded: use the board vendor's kernel "
        "and check `dmesg | grep -i rknpu`",
    )
    version = (
        daemon.driver_version or board.output(f"cat {' '.join(DRIVER_VERSION_FILES)} 2>/dev/null").strip()
    )
    yield _driver_check(version)


def _daemon_process_checks(board: BoardShell, socket_name: str) -> Iterator[Check]:
    """Is a daemon running, is it ours or the vendor's, and does it listen on the abstract socket."""
    found = board.output(_FIND_DAEMONS)
    processes = [line.split(maxsplit=1) for line in found.splitlines() if line.strip()]
    vendor = [f"pid {pid} ({exe[0]})" for pid, *exe in processes if exe and is_vendor_binary(exe[0])]
    ours = [f"pid {pid}" for pid, *exe in processes if not (exe and is_vendor_binary(exe[0]))]
    unix_table = board.output(f"grep -F @{socket_name} /proc/net/unix")
    listening = any(line.split()[-1] == f"@{socket_name}" for line in unix_table.splitlines() if line.split())
    if vendor and not ours and not listening:
        yield Check(
            "daemon process",
            False,
            f"the vendor's closed rknn_server runs instead of this project's daemon: {', '.join(vendor)}",
            VENDOR_FIX + "; then start this project's daemon (`rknn_server serve`)",
        )
        return
    if not ours and not listening:
        yield Check(
            "daemon process",
            False,
            "no rknn_server daemon runs on the board",
            "start it on the board with `rknn_server serve` (or the service that deploy/ installs)",
        )
        return
    if not listening:
        yield Check(
            "daemon process",
            False,
            f"rknn_server runs ({', '.join(ours)}) but nothing listens on @{socket_name}",
            f"restart it listening on unix-abstract:{socket_name} (the default `--listen` of "
            "`rknn_server serve`), or name the socket it uses with --socket",
        )
        return
    running = ", ".join(ours) if ours else f"no process named rknn_server, but @{socket_name} is listening"
    yield Check("daemon process", True, running)
    if vendor:
        detail = f"also running: {', '.join(vendor)}"
        yield Check("vendor rknn_server", False, detail, VENDOR_FIX, blocking=False)
    scripts = board.output(f"ls {' '.join(VENDOR_SCRIPTS)} 2>/dev/null").split()
    if scripts:
        detail = f"the vendor's respawn scripts exist: {', '.join(scripts)}"
        yield Check("vendor start scripts", False, detail, VENDOR_FIX, blocking=False)
    yield Check("abstract socket", True, f"@{socket_name} is listening")
    yield _toolkit_path_check(board)


def _toolkit_path_check(board: BoardShell) -> Check:
    """Whether the unmodified RKNN-Toolkit2 finds this daemon: the process name its `ps` looks for,
    the legacy socket its adb forward reaches, and the launcher it runs when it finds no daemon."""
    facts = dict(line.split("=", 1) for line in board.output(_TOOLKIT_PROBE).splitlines() if "=" in line)
    seen, missing, fixes = [], [], []
    if facts.get("named", "").strip():
        seen.append("a process named rknn_server")
    else:
        missing.append("no process named rknn_server (the toolkit's `ps -A | grep rknn_server` finds none)")
        fixes.append("start the daemon with the `rknn_server` command, not `python -m rknn_server`")
    sockets = facts.get("sockets", "").split()
    if sockets:
        seen.append(f"the toolkit socket listening ({', '.join(sockets)})")
    else:
        missing.append(f"nothing listens on {' or '.join(LEGACY_SOCKETS)}")
        fixes.append(
            "the toolkit listener is off: it is on by default on a board unless --auth-token-file is given; "
            "pass `--legacy-listen unix-abstract:transfer_proxy` to serve it anyway (it has no authentication)"
        )
    launcher = facts.get("launcher", "").strip()
    if launcher == "#!":
        seen.append(f"{TOOLKIT_LAUNCHER} starts this daemon")
    else:
        missing.append(
            f"{TOOLKIT_LAUNCHER} is missing"
            if not launcher
            else f"{TOOLKIT_LAUNCHER} is not a launcher script (the vendor's binary?)"
        )
        fixes.append(
            f"run `rknn-client deploy` as root, or `ln -sf /opt/rknn-server/bin/rknn_server {TOOLKIT_LAUNCHER}`"
        )
    if not missing:
        return Check("toolkit path", True, "; ".join(seen))
    return Check(
        "toolkit path",
        False,
        "RKNN-Toolkit2 (its own protocol) will not reach this daemon: " + "; ".join(missing),
        "; ".join(fixes) + " (only needed for the unmodified toolkit; rknn_client works without)",
        blocking=False,
    )


def _daemon_checks(
    endpoint: Endpoint, device_id: str, timeout: float, token: str | None
) -> Generator[Check, None, rknn_pb2.GetInfoResponse | None]:
    """The gRPC handshake, protocol and runtime; returns GetInfo's answer, or None when it failed.

    Closes `endpoint`."""
    try:
        with Device(endpoint, token=token) as device:
            info = device.handshake(timeout)
    except AuthenticationFailed as error:
        yield Check("gRPC handshake", False, str(error), TOKEN_FIX)
        return None
    except (RknnError, TransportError) as error:
        yield Check(
            "gRPC handshake",
            False,
            str(error),
            "the process on the socket is not this project's daemon or is stuck: read its log, restart it, "
            "and make sure the vendor's rknn_server is not the one listening",
        )
        return None
    yield Check("gRPC handshake", True, f"rknn_server {info.daemon_version} answered GetInfo")
    mismatch = check_versions(info, device_id or endpoint.description, device_id)
    if mismatch is not None:
        yield Check("protocol version", False, mismatch.problem, mismatch.fix)
        return None
    yield Check("protocol version", True, f"daemon {info.protocol_version}, client {PROTOCOL_VERSION}")
    npu = info.runtime == "rknnrt"
    reason = f" ({info.runtime_reason})" if info.runtime_reason else ""
    detail = f"{info.runtime} {info.runtime_version}".strip() + reason
    yield Check(
        "runtime library",
        npu,
        detail,
        "install librknnrt.so on the board (/usr/lib) and restart the daemon, or point it there with "
        "`--runtime-lib PATH`; until then models run on the board's CPU",
        blocking=False,
    )
    return info


def _tcp_chain(device_id: str, timeout: float, token: str | None) -> Iterator[Check]:
    host, _, port_text = device_id.removeprefix("tcp://").rpartition(":")
    if not host:
        host, port_text = port_text, str(DEFAULT_PORT)
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port_text)), timeout=timeout):
            pass
    except (OSError, ValueError) as error:
        yield Check(
            "tcp connect",
            False,
            f"cannot connect to {host}:{port_text}: {error}",
            _listen_fix(host, port_text),
        )
        return
    yield Check("tcp connect", True, f"{host}:{port_text} accepts connections")
    daemon = yield from _daemon_checks(tcp_endpoint(device_id), device_id, timeout, token)
    if daemon is not None:
        yield _driver_check(daemon.driver_version)


def _listen_fix(host: str, port: str) -> str:
    """How to get a daemon listening where `host:port` points: on this PC for a loopback address (no
    token needed there), else on the board, reachable from the network and so with a token."""
    if host in _LOOPBACK_HOSTS or host.startswith("127."):
        return (
            f"nothing listens on this PC's port {port}: start a daemon here with `rknn_server serve --listen "
            f"tcp://{host}:{port}` (loopback: no token needed), or forward a board's daemon to that port; "
            "for a board on the network, give its address instead"
        )
    return (
        f"start the daemon on the board with `--listen tcp://0.0.0.0:{port} --auth-token-file FILE` "
        f"(FILE: a secret token, mode 0600; the daemon refuses other addresses than loopback without "
        f"one) and give this PC the same token in {ENV_TOKEN}; check the network and firewall between "
        "this PC and the board"
    )


def is_vendor_binary(exe: str) -> bool:
    """The closed daemon is an executable named rknn_server in /usr/bin or /oem/usr/bin.

    This project's daemon runs as a Python interpreter, so its /proc/PID/exe never ends so.
    """
    return exe.endswith(VENDOR_BINARY_SUFFIX)


def _driver_check(version: str) -> Check:
    return Check(
        "NPU driver version",
        bool(version),
        version or "unknown",
        "read it on the board with `dmesg | grep -i rknpu`",
        blocking=False,
    )
