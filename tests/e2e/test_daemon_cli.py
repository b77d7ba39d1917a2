"""`rknn_server`'s command line as users, containers and service units drive it: --help with every
default and variable, options from RKNN_SERVER_* variables and a --config TOML file checked on a live
daemon (its GetInfo limits), their precedence, and errors that name the option, its source and a fix."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest

from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_server.cli import serve_parser
from rknn_server.config.options import layered_options, parse_layered
from rknn_server.testing import DaemonProcess, clean_environ, start_daemon

GiB, MiB = 1 << 30, 1 << 20


def rknn_server(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the daemon's command line to completion (help, errors, health probes)."""
    return subprocess.run(
        [sys.executable, "-m", "rknn_server", *argv],
        capture_output=True,
        text=True,
        env={**clean_environ(), **(env or {})},
        timeout=120,
        check=False,
    )


def limits(daemon: DaemonProcess) -> rknn_pb2.Limits:
    with grpc.insecure_channel(daemon.address) as channel:
        reply = rknn_pb2_grpc.RknnServerStub(channel).GetInfo(rknn_pb2.GetInfoRequest(), timeout=30)
    return reply.limits


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    """Daemons a test starts, each stopped (by PID) at the end and expected to exit cleanly."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        assert daemon.stop() == 0, daemon.log_text()[-2000:]


def option_help(text: str, option: str) -> str:
    """The help entry of one option in `--help` output: from its flag to the next option's line."""
    match = re.search(rf"^  {re.escape(option)}\b.*?(?=^  -|^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{option} is not in --help"
    return " ".join(match.group(0).split())


def test_help_groups_options_and_shows_each_default_and_variable() -> None:
    result = rknn_server("--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for heading in (
        "listeners and security:",
        "model cache:",
        "sessions and limits:",
        "runtime:",
        "logging:",
    ):
        assert f"\n{heading}\n" in text
    for key in layered_options(serve_parser()):
        entry = option_help(text, f"--{key}")
        variable = "RKNN_SERVER_" + key.replace("-", "_").upper()
        assert f"env {variable}" in entry, entry
        assert "default" in entry, entry
    # Sizes as people read them, not 17179869184 or 8.38861e+06.
    assert "default: 16 GiB" in option_help(text, "--cache-quota")
    assert "default: 8 MiB" in option_help(text, "--max-message-bytes")
    assert "default: 300 s" in option_help(text, "--session-idle-timeout")
    assert "default: tcp://127.0.0.1:50515, unix-abstract:rknn_server" in option_help(text, "--listen")
    assert "--config FILE" in text


def test_health_is_a_subcommand_with_its_own_help() -> None:
    result = rknn_server("health", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rknn_server health")
    assert "--timeout S" in result.stdout and "ADDR" in result.stdout
    assert "--cache-quota" not in result.stdout  # the daemon's options are not the probe's


def test_a_mistyped_command_or_flag_gets_a_suggestion() -> None:
    command = rknn_server("helth")
    assert command.returncode == 2
    assert "unknown command 'helth'; did you mean 'health'?" in command.stderr
    flag = rknn_server("--cache-qouta", "1GiB")
    assert flag.returncode == 2
    assert "did you mean '--cache-quota'?" in flag.stderr


def test_environment_and_config_file_configure_a_live_daemon(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """File < environment < command line, seen in the limits a real daemon reports."""
    config = tmp_path / "rknn_server.toml"
    config.write_text(
        'cache-quota = "1GiB"\n'  # overridden by the environment
        'max-tensor-bytes = "64MiB"\n'  # from the file only
        "max_chunk_bytes = 1048576\n"  # overridden by the command line; underscores are taken too
        "max-sessions = 5\n"
        "session-idle-timeout = 42.5\n"
    )
    env = {
        "RKNN_SERVER_CONFIG": str(config),
        "RKNN_SERVER_CACHE_QUOTA": "3GiB",
        "RKNN_SERVER_MAX_MODEL_BYTES": "1GiB",  # overridden by the command line
        "RKNN_SERVER_MAX_SESSIONS_PER_CLIENT": "2",
    }
    args = ["--runtime", "host", "--max-chunk-bytes", "2MiB", "--max-model-bytes", "512MiB"]
    daemons.append(start_daemon(tmp_path / "cache", tmp_path / "daemon.log", args, env=env))
    got = limits(daemons[0])
    assert got.model_cache_quota_bytes == 3 * GiB
    assert got.max_tensor_bytes == 64 * MiB
    assert got.max_chunk_bytes == 2 * MiB
    assert got.max_model_bytes == 512 * MiB
    assert got.max_sessions == 5
    assert got.session_idle_timeout_s == 42.5
    assert got.max_sessions_per_client == 2


def test_listen_from_the_environment_is_a_comma_list_and_health_probes_it(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    socket = f"unix-abstract:rknn-cli-test-{uuid.uuid4().hex}"
    env = {"RKNN_SERVER_LISTEN": f"tcp://127.0.0.1:0, {socket}", "RKNN_SERVER_RUNTIME": "host"}
    daemon = start_daemon(tmp_path / "cache", tmp_path / "daemon.log", env=env, listen_tcp=False)
    daemons.append(daemon)
    for address in (daemon.url, socket):
        probe = rknn_server("health", address)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.strip() == f"rknn_server at {address}: SERVING"
    daemon.stop()
    gone = rknn_server("health", socket, "--timeout", "1")
    assert gone.returncode == 1
    assert "is not answering" in gone.stderr


def test_precedence_is_command_line_then_environment_then_file(tmp_path: Path) -> None:
    config = tmp_path / "rknn_server.toml"
    config.write_text(
        'listen = ["tcp://127.0.0.1:1"]\nmax-sessions = 3\nlog-level = "debug"\nverify-cache = true\n'
    )
    parser = serve_parser()
    env = {"RKNN_SERVER_MAX_SESSIONS": "4", "RKNN_SERVER_LISTEN": "tcp://127.0.0.1:2,tcp://127.0.0.1:3"}
    args = parse_layered(parser, ["--config", str(config)], env)
    assert (args.max_sessions, args.log_level, args.verify_cache) == (4, "debug", True)
    assert args.listen == ["tcp://127.0.0.1:2", "tcp://127.0.0.1:3"]
    # A repeatable flag on the command line replaces the environment's list rather than adding to it.
    args = parse_layered(serve_parser(), ["--config", str(config), "--listen", "tcp://127.0.0.1:4"], env)
    assert args.listen == ["tcp://127.0.0.1:4"]
    args = parse_layered(serve_parser(), ["--max-sessions", "9"], {**env, "RKNN_SERVER_CONFIG": str(config)})
    assert (args.max_sessions, args.log_level) == (9, "debug")
    # Nothing set anywhere: the parser's defaults.
    assert parse_layered(serve_parser(), [], {}).listen == [
        "tcp://127.0.0.1:50515",
        "unix-abstract:rknn_server",
    ]


def test_a_client_variable_in_the_environment_is_not_an_error() -> None:
    args = parse_layered(serve_parser(), [], {"RKNN_SERVER_TOKEN": "t", "RKNN_SERVER_TLS_CA": "/ca.pem"})
    assert args.tls_cert is None


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "env",
            "unknown environment variable RKNN_SERVER_CACHE_QUOTE; did you mean 'RKNN_SERVER_CACHE_QUOTA'?",
        ),
        ("file", "unknown key 'cache-qouta'; did you mean 'cache-quota'?"),
    ],
)
def test_an_unknown_setting_is_refused_with_a_suggestion(tmp_path: Path, source: str, expected: str) -> None:
    config = tmp_path / "rknn_server.toml"
    config.write_text('cache-qouta = "16GiB"\n')
    argv, env = (
        (["--config", str(config)], {}) if source == "file" else ([], {"RKNN_SERVER_CACHE_QUOTE": "1"})
    )
    result = rknn_server(*argv, "--model-cache", str(tmp_path / "cache"), env=env)
    assert result.returncode == 2
    assert expected in result.stderr
    assert not (tmp_path / "cache").exists()  # refused before doing anything


@pytest.mark.parametrize("source", ["flag", "env", "file"])
def test_a_bad_size_names_the_option_and_where_it_came_from(tmp_path: Path, source: str) -> None:
    config = tmp_path / "rknn_server.toml"
    config.write_text('cache-quota = "lots"\n')
    argv, env, where = {
        "flag": (["--cache-quota", "lots"], {}, "argument --cache-quota:"),
        "env": ([], {"RKNN_SERVER_CACHE_QUOTA": "lots"}, "--cache-quota from $RKNN_SERVER_CACHE_QUOTA:"),
        "file": (["--config", str(config)], {}, f"--cache-quota from {config}:cache-quota:"),
    }[source]
    result = rknn_server(*argv, env=env)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert where in last and "'lots' is not a size; expected bytes or a number with a unit" in last, last


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            {"RKNN_SERVER_ISOLATION": "proc"},
            "--isolation from $RKNN_SERVER_ISOLATION: 'proc' is not one of thread, process",
        ),
        (
            {"RKNN_SERVER_MAX_SESSIONS": "1.5"},
            "--max-sessions from $RKNN_SERVER_MAX_SESSIONS: '1.5' is not an integer",
        ),
        ({"RKNN_SERVER_VERIFY_CACHE": "maybe"}, "'maybe' is not a switch; expected true or false"),
        (
            {"RKNN_SERVER_LISTEN": "http://x:1"},
            "--listen from $RKNN_SERVER_LISTEN: listen address 'http://x:1'",
        ),
    ],
)
def test_a_bad_value_from_the_environment_says_what_is_expected(
    setting: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_layered(serve_parser(), [], setting)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_or_broken_config_file_is_reported(tmp_path: Path) -> None:
    missing = rknn_server("--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2
    assert f"cannot read the config file {tmp_path / 'nope.toml'}" in missing.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("cache-quota = \n")
    result = rknn_server("--config", str(broken))
    assert result.returncode == 2
    assert f"config file {broken} is not valid TOML" in result.stderr


def test_a_private_daemon_ignores_the_callers_rknn_server_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's TLS files (or any daemon setting) in its environment must not reach the private daemon it
    starts: it would read RKNN_SERVER_TLS_CERT as its own certificate, or refuse an unknown variable."""
    from rknn_client.transport.private import start_private_daemon

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("RKNN_SERVER_TLS_CERT", str(tmp_path / "client-cert.pem"))
    monkeypatch.setenv("RKNN_SERVER_TLS_KEY", str(tmp_path / "client-key.pem"))
    monkeypatch.setenv("RKNN_SERVER_MAX_SESSIONS", "many")
    endpoint = start_private_daemon()
    try:
        with grpc.insecure_channel(endpoint.grpc_target) as channel:
            reply = rknn_pb2_grpc.RknnServerStub(channel).GetInfo(
                rknn_pb2.GetInfoRequest(),
                metadata=[("authorization", f"Bearer {endpoint.token}")],
                timeout=30,
            )
        assert reply.limits.max_sessions == 64
    finally:
        endpoint.close()
