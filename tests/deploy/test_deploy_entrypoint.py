"""The container's own command line, run on the host: the daemon starts and the image's health probe passes.

The host image's ENTRYPOINT + CMD run as written, except that the listen address becomes a free loopback
port and the model cache a temporary folder; the HEALTHCHECK command then runs against that port.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from deploy_files import BOARD_ARGS, REPO, Dockerfile

from rknn_proto.ready import tcp_address

IMAGE_PORT = "50515"
# How long the daemon may take to start before the test gives up (a hang guard, not a measurement).
START_DEADLINE_S = 120


def host_command(dockerfile: Dockerfile, cache: Path, token_file: Path) -> tuple[list[str], dict[str, str]]:
    """The host image's command line and its RKNN_SERVER_* settings, with the listener, the cache and
    the token file moved to places this test owns."""
    stage = dockerfile.stage("host")
    argv = (
        dockerfile.effective(stage, "ENTRYPOINT").exec_form() + dockerfile.effective(stage, "CMD").exec_form()
    )
    assert not [arg for arg in argv if arg.startswith("--")], (
        "settings belong in ENV, where `-e` overrides them"
    )
    env = {k: v for k, v in dockerfile.environment(stage).items() if k.startswith("RKNN_SERVER_")}
    listens = env["RKNN_SERVER_LISTEN"].split(",")
    assert all(a.startswith("tcp://") for a in listens), "only TCP is reachable from outside a container"
    assert "RKNN_SERVER_AUTH_TOKEN_FILE" in env, (
        "the container listens beyond loopback: it must require a token"
    )
    env.update(
        RKNN_SERVER_LISTEN="tcp://127.0.0.1:0",
        RKNN_SERVER_MODEL_CACHE=str(cache),
        RKNN_SERVER_AUTH_TOKEN_FILE=str(token_file),
    )
    return argv, env


def probe_argv(dockerfile: Dockerfile, port: int) -> list[str]:
    probe = dockerfile.effective(dockerfile.stage("host"), "HEALTHCHECK").exec_form()
    address = f"tcp://127.0.0.1:{IMAGE_PORT}"
    assert address in probe, probe
    return [f"tcp://127.0.0.1:{port}" if arg == address else arg for arg in probe]


def shim_bin(folder: Path) -> Path:
    """A `rknn_server` command like the one pip installs (the console script), running this source tree."""
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'rknn_server = "rknn_server.cli:main"' in pyproject
    folder.mkdir()
    shim = folder / "rknn_server"
    code = "import sys; from rknn_server.cli import main; sys.exit(main())"
    shim.write_text(f"#!/bin/sh\nexec '{sys.executable}' -c '{code}' \"$@\"\n")
    shim.chmod(0o755)
    return folder


def read_port(daemon: subprocess.Popen[str]) -> int:
    """The port from the daemon's `listening on` line; its other output is kept for the failure message."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert daemon.stdout is not None
        for line in daemon.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=START_DEADLINE_S)
        except queue.Empty:
            raise AssertionError(f"no `listening on` line; output so far: {seen}") from None
        if line is None:
            raise AssertionError(f"the daemon exited with {daemon.wait()}; output: {seen}")
        seen.append(line)
        address = tcp_address(line)
        if address is not None and address.startswith("127.0.0.1:"):
            return int(address.rsplit(":", 1)[1])


def stop(daemon: subprocess.Popen[str]) -> None:
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def daemon_env(tmp_path: Path) -> dict[str, str]:
    """The environment with `rknn_server` on PATH, or a skip while the daemon is not in the tree."""
    if not (REPO / "server" / "cli.py").is_file():
        pytest.skip("the daemon CLI (server/cli.py) is not in this tree yet")
    return {
        **os.environ,
        "PATH": f"{shim_bin(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }


def test_daemon_knows_every_flag_the_deploy_files_pass(tmp_path: Path, dockerfile: Dockerfile) -> None:
    """A flag the daemon lacks would make every board unit and container exit at start."""
    env = daemon_env(tmp_path)
    used = {arg for arg in BOARD_ARGS if arg.startswith("--")}
    variables: set[str] = set()
    for flavor in ("board", "host"):
        stage = dockerfile.stage(flavor)
        used |= {a for a in dockerfile.effective(stage, "CMD").exec_form() if a.startswith("--")}
        variables |= {k for k in dockerfile.environment(stage) if k.startswith("RKNN_SERVER_")}
    result = subprocess.run(
        ["rknn_server", "serve", "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    known = set(re.findall(r"--[a-z][a-z0-9-]*", result.stdout))
    assert used <= known, f"flags the daemon does not know: {sorted(used - known)}"
    known_variables = set(re.findall(r"RKNN_SERVER_[A-Z0-9_]+", result.stdout))
    assert variables <= known_variables, (
        f"variables the daemon does not know: {sorted(variables - known_variables)}"
    )


def test_container_command_serves_its_health_probe(tmp_path: Path, dockerfile: Dockerfile) -> None:
    env = daemon_env(tmp_path)
    token = tmp_path / "auth-token"
    token.write_text("client:s3cret-token-for-the-test\n")
    token.chmod(0o600)
    argv, settings = host_command(dockerfile, tmp_path / "cache", token)
    with (tmp_path / "daemon.stderr").open("w") as stderr:
        daemon = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**env, **settings},
            cwd=tmp_path,
            start_new_session=True,
        )
        try:
            port = read_port(daemon)
            healthy = subprocess.run(
                probe_argv(dockerfile, port), capture_output=True, text=True, env=env, timeout=60, check=False
            )
        finally:
            stop(daemon)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr + (tmp_path / "daemon.stderr").read_text()
    # The same probe must fail once the daemon is gone, or it proves nothing.
    gone = subprocess.run(probe_argv(dockerfile, port), capture_output=True, env=env, timeout=60, check=False)
    assert gone.returncode != 0
