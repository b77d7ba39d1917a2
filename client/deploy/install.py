"""Deploy steps on the board: push the bundle, install it into a venv, (re)start the daemon, verify it.

Everything lives under INSTALL_DIR (the venv itself, the bundle, the model cache, the log and the pid
file), so removing that one folder undoes a deploy. A second deploy of the same version only verifies.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import adbutils

from rknn_client import __version__
from rknn_client.boards.doctor import TOKEN_FIX
from rknn_client.boards.shell import BoardShell
from rknn_client.deploy.board import (
    INSTALL_DIR,
    DeployError,
    DeployRefused,
    probe,
    refuse_unsupported,
    refuse_vendor_daemon,
    vendor_script_warning,
)
from rknn_client.deploy.bundle import Bundle, BundleBuilder, build_bundle
from rknn_client.device import Device
from rknn_client.errors import AuthenticationFailed, RknnError
from rknn_client.transport.adb import connect_adb_server, find_device, open_adb, require_ready
from rknn_client.transport.base import TransportError
from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET

BUNDLE_DIR = f"{INSTALL_DIR}/bundle"
LOG_FILE = f"{INSTALL_DIR}/rknn_server.log"
PID_FILE = f"{INSTALL_DIR}/rknn_server.pid"
CACHE_DIR = f"{INSTALL_DIR}/cache"
# RKNN-Toolkit2 runs `nohup /usr/bin/rknn_server` (no arguments) when `ps` shows no rknn_server:
# deploy makes that path a launcher of this daemon, and never overwrites a file there that is not one.
TOOLKIT_LAUNCHER = "/usr/bin/rknn_server"
LAUNCHER_MARK = "rknn-server-oss launcher"
_INSTALL_SECONDS = 900.0
_START_SECONDS = 90.0
_ANSWER_SECONDS = 5.0
_STOP_SECONDS = 10


@dataclass
class DeployResult:
    serial: str
    version: str
    actions: list[str] = field(default_factory=list)  # what changed on the board; empty when nothing did
    notes: list[str] = field(default_factory=list)  # warnings worth reading

    def report(self) -> str:
        done = (
            "; ".join(self.actions)
            if self.actions
            else f"rknn_server {self.version} already installed and running"
        )
        lines = [f"{self.serial}: {done}; the daemon answers."]
        return "\n".join([*lines, *(f"warning: {note}" for note in self.notes)])


def deploy(
    device_id: str | None,
    *,
    socket_name: str = DEFAULT_ABSTRACT_SOCKET,
    builder: BundleBuilder = build_bundle,
    progress: Callable[[str], None] = lambda _: None,
    token: str | None = None,
) -> DeployResult:
    """Install (or upgrade to) this client's daemon version on the adb board `device_id` and start it.

    The daemon is asked with the credentials every command uses (`token`, else RKNN_SERVER_TOKEN): a
    running daemon that refuses them is left alone (DeployRefused) rather than replaced."""
    client = connect_adb_server(start=True)
    info = find_device(client, device_id)
    require_ready(info)
    device = client.device(info.serial)
    shell = BoardShell(device)
    facts = probe(info.serial, shell)
    refuse_unsupported(facts)
    refuse_vendor_daemon(facts)
    result = DeployResult(info.serial, __version__)
    warning = vendor_script_warning(facts)
    if warning:
        result.notes.append(warning)
    if facts.installed_version != __version__:
        progress(f"building the offline bundle for {facts.arch} Python {facts.python_tag}")
        with tempfile.TemporaryDirectory(prefix="rknn-bundle-") as folder:
            bundle = builder(facts, Path(folder))
            progress(f"pushing {len(list(bundle.directory.glob('*.whl')))} wheels to {BUNDLE_DIR}")
            _push(device, shell, bundle)
        _install(shell, bundle)
        result.actions.append(f"installed rknn_server {__version__} into {INSTALL_DIR}" + (
            f" (was {facts.installed_version})" if facts.installed_version else ""))  # fmt: skip
        launcher = _install_launcher(shell)
        (result.actions if launcher.startswith("installed") else result.notes).append(launcher)
    elif facts.running_pid is not None and _answers(info.serial, socket_name, token, once=True):
        return result
    if facts.running_pid is not None:
        _stop(shell, facts.running_pid)
        result.actions.append(f"stopped the old daemon (pid {facts.running_pid})")
    progress("starting the daemon")
    pid = _start(shell, socket_name)
    result.actions.append(f"started the daemon (pid {pid}, log {LOG_FILE})")
    if not _answers(info.serial, socket_name, token, once=False, alive=lambda: _running(shell, pid)):
        tail = shell.output(f"tail -n 20 {LOG_FILE}")
        what = (
            "exited at start"
            if not _running(shell, pid)
            else f"did not answer GetInfo within {_START_SECONDS:.0f} s"
        )
        raise DeployError(
            f"the daemon on {info.serial} {what}; its log ends:\n{tail}",
            f"read {LOG_FILE} on the board (`adb shell cat {LOG_FILE}`) and run `rknn-client doctor`",
        )
    return result


def _checked(shell: BoardShell, command: str, what: str, timeout: float = 60.0) -> str:
    result = shell.run(command, timeout=timeout)
    if not result.ok:
        raise DeployError(
            f"{what} failed on the board (exit {result.code}): {result.output.strip()[-2000:]}",
            "fix the cause shown and run deploy again (it resumes: the steps done stay done)",
        )
    return result.output


def _push(device: adbutils.AdbDevice, shell: BoardShell, bundle: Bundle) -> None:
    _checked(shell, f"rm -rf {BUNDLE_DIR} && mkdir -p {BUNDLE_DIR}", "creating the bundle folder")
    for wheel in sorted(bundle.directory.glob("*.whl")):
        device.sync.push(wheel, f"{BUNDLE_DIR}/{wheel.name}", mode=0o644)


def _install(shell: BoardShell, bundle: Bundle) -> None:
    """A venv without pip (so python3-venv's ensurepip is not needed), filled by pip run from its wheel."""
    system = " --system-site-packages" if bundle.system_site_packages else ""
    _checked(
        shell,
        f"test -x {INSTALL_DIR}/bin/python || python3 -m venv --without-pip{system} {INSTALL_DIR}",
        f"creating the venv {INSTALL_DIR}",
    )
    pip = f"{INSTALL_DIR}/bin/python {BUNDLE_DIR}/{bundle.pip_wheel}/pip"
    options = "--no-index --no-cache-dir --disable-pip-version-check --find-links " + BUNDLE_DIR
    deps = "" if bundle.with_dependencies else " --no-deps"
    target = shlex.quote(f"{BUNDLE_DIR}/{bundle.project_wheel}[server]")
    _checked(shell, f"{pip} install {options}{deps} {target}", "pip install", timeout=_INSTALL_SECONDS)
    _checked(shell, f"rm -rf {BUNDLE_DIR}", "removing the bundle")


def launcher_script() -> str:
    return (
        f"#!/bin/sh\n# {LAUNCHER_MARK}: RKNN-Toolkit2 starts {TOOLKIT_LAUNCHER} when no rknn_server runs.\n"
        f'exec {INSTALL_DIR}/bin/rknn_server serve --model-cache {CACHE_DIR} "$@"\n'
    )


def _install_launcher(shell: BoardShell) -> str:
    """What became of TOOLKIT_LAUNCHER, as an action ("installed ...") or a note."""
    path = TOOLKIT_LAUNCHER
    result = shell.run(
        f"if [ -e {path} ] && ! grep -qF {shlex.quote(LAUNCHER_MARK)} {path}; then echo kept; "
        f"else mkdir -p {path.rsplit('/', 1)[0]} && printf %s {shlex.quote(launcher_script())} > {path} "
        f"&& chmod 0755 {path} && echo installed; fi"
    )
    said = result.output.strip().splitlines()[-1:] if result.ok else []
    if said == ["installed"]:
        return f"installed {path}, which RKNN-Toolkit2 starts when it finds no rknn_server running"
    if said == ["kept"]:
        return (
            f"{path} exists and is not this project's launcher (the vendor's daemon?): left as it is, so "
            f"RKNN-Toolkit2 would start that one when this daemon is not running; replace it with "
            f"`ln -sf {INSTALL_DIR}/bin/rknn_server {path}` once the vendor's daemon is retired"
        )
    return (
        f"could not write {path} ({result.output.strip()[-200:] or f'exit {result.code}'}): RKNN-Toolkit2 "
        "cannot start this daemon by itself; run deploy as root or create it by hand"
    )


def _stop(shell: BoardShell, pid: int) -> None:
    _checked(
        shell,
        f"kill {pid} 2>/dev/null; for i in $(seq {_STOP_SECONDS}); do kill -0 {pid} 2>/dev/null || exit 0; sleep 1; done; "
        f"kill -9 {pid} 2>/dev/null; exit 0",
        f"stopping the old daemon (pid {pid})",
    )


def _start(shell: BoardShell, socket_name: str) -> int:
    """Start in its own session, detached from adb, its output appended to LOG_FILE; returns its pid."""
    command = (
        f"{INSTALL_DIR}/bin/rknn_server serve --listen unix-abstract:{shlex.quote(socket_name)} "
        f"--model-cache {CACHE_DIR} --log-format json"
    )
    output = _checked(
        shell,
        f"cd {INSTALL_DIR} && setsid nohup {command} </dev/null >>{LOG_FILE} 2>&1 & "
        f"echo $! > {PID_FILE}; cat {PID_FILE}",
        "starting the daemon",
    )
    return int(output.strip().splitlines()[-1])


def _running(shell: BoardShell, pid: int) -> bool:
    return shell.run(f"kill -0 {pid}").ok


def _answers(
    serial: str, socket_name: str, token: str | None, once: bool, alive: Callable[[], bool] = lambda: True
) -> bool:
    """Whether the daemon answers GetInfo with this client's version through an adb forward, asked
    until it does, `alive()` turns false (it died: no use waiting) or the start time is over; a
    daemon refusing this client's credentials is an error, not a daemon to replace."""
    deadline = time.monotonic() + (0 if once else _START_SECONDS)
    while True:
        try:
            with Device(open_adb(serial, socket_name=socket_name), token=token) as device:
                if device.handshake(_ANSWER_SECONDS).daemon_version == __version__:
                    return True
        except AuthenticationFailed as error:
            # Before anything changed on the board (`once`) it is left as it was.
            refused = DeployRefused if once else DeployError
            raise refused(
                f"the daemon on {serial} refused this client's credentials: {error}", TOKEN_FIX
            ) from None
        except (TransportError, RknnError):
            pass
        if time.monotonic() >= deadline or not alive():
            return False
        time.sleep(0.5)
