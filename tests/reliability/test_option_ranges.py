"""Nonsense settings are refused at start (security finding 8): a value outside an option's range from
a flag, an RKNN_SERVER_* variable or the --config file stops `rknn_server` with exit 2 and one error
line naming the option, where the value came from and the range it takes, before it binds a port or
writes a byte; -1 sessions or a negative idle timeout (which turned the idle-stream defence off) never
reach the daemon, and a 100 GiB gRPC message size is no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from rknn_proto import rknn_pb2
from rknn_server.cli import serve_parser
from rknn_server.config.limits import Limits
from rknn_server.config.options import Bounded, env_name, layered_options, parse_layered
from rknn_server.testing import clean_environ

# (config-file key, a bad value as the file writes it, what the error says the option takes)
BAD = [
    ("max-sessions", -1, "an integer from 1 to "),
    ("max-inflight-requests", 0, "an integer from 1 to "),
    ("partial-ttl", -1, "a number of seconds from 0 s to "),
    ("stream-idle-timeout", -1, "a number of seconds from 0 s to "),
    (
        "max-message-bytes",
        "100GiB",
        "bytes or a number with a unit, e.g. 512MiB or 2GiB, from 64 KiB to 1 GiB",
    ),
]
SOURCES = ("flag", "env", "file")
# A daemon that wrongly starts must not linger: long enough for a loaded machine to print an error.
REFUSE_WITHIN_S = 60


def refused(tmp_path: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Runs `rknn_server` with a setting that must stop it; a daemon that starts instead is killed by
    PID and fails the test."""
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "rknn_server", "--listen", "tcp://127.0.0.1:0", "--no-legacy"]
    with subprocess.Popen(
        [*command, "--runtime", "host", "--model-cache", str(cache), *argv],
        env={**clean_environ(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=REFUSE_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail(f"rknn_server {' '.join(argv)} {env} started instead of refusing")
    assert not cache.exists(), "refused only after it began to set up"
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def setting(tmp_path: Path, source: str, key: str, value: object) -> tuple[list[str], dict[str, str], str]:
    """argv and environment giving `key` its value from `source`, and how the error names that source."""
    option = f"--{key}"
    if source == "flag":
        return [option, str(value)], {}, f"argument {option}: "
    if source == "env":
        return [], {env_name(option): str(value)}, f"{option} from ${env_name(option)}: "
    config = tmp_path / "rknn_server.toml"
    shown = f'"{value}"' if isinstance(value, str) else str(value)  # TOML's own types: -1, "100GiB"
    config.write_text(f"{key} = {shown}\n")
    return ["--config", str(config)], {}, f"{option} from {config}:{key}: "


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("key", "value", "expected"), BAD, ids=[b[0] for b in BAD])
def test_the_daemon_refuses_a_value_outside_the_range(
    tmp_path: Path, source: str, key: str, value: object, expected: str
) -> None:
    argv, env, where = setting(tmp_path, source, key, value)
    result = refused(tmp_path, argv, env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    assert where in errors[0] and f"'{value}'" in errors[0], errors[0]
    assert f"out of range; expected {expected}" in errors[0], errors[0]


def bounded_options() -> dict[str, Bounded]:
    """Every numeric option of the daemon, by config-file key, with the range it takes."""
    options = layered_options(serve_parser())
    unranged = [
        key for key, a in options.items() if a.type in (int, float) or a.metavar in ("N", "S", "SIZE")
    ]
    assert not [key for key in unranged if not isinstance(options[key].type, Bounded)], (
        "an option without a range"
    )
    found = {key: a.type for key, a in options.items() if isinstance(a.type, Bounded)}
    assert {limit.flag for limit in Limits.flags()} <= {f"--{key}" for key in found}
    return found


def outside(bounds: Bounded) -> list[str]:
    """Values just below and far above the range, and the floats that are no number of seconds."""
    below = bounds.low - (0.05 if bounds.kind == "seconds" else 1)
    values = [str(int(below)) if bounds.kind != "seconds" else repr(below), str(int(bounds.high) * 2)]
    return values + (["nan", "inf"] if bounds.kind == "seconds" else [])


@pytest.mark.parametrize("source", SOURCES)
def test_every_numeric_option_checks_its_range_from_every_source(
    tmp_path: Path, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, bounds in bounded_options().items():
        for value in outside(bounds):
            argv, env, where = setting(tmp_path, source, key, value)
            with pytest.raises(SystemExit) as stop:
                parse_layered(serve_parser(), argv, env)
            error = capsys.readouterr().err.strip().splitlines()[-1]
            assert stop.value.code == 2 and where in error and bounds.expected() in error, (key, value, error)
        for edge in (bounds.low, bounds.high):  # the range is inclusive: both ends are taken
            text = str(int(edge)) if bounds.kind != "seconds" else repr(edge)
            argv, env, _ = setting(tmp_path, source, key, text)
            parser = serve_parser()
            assert getattr(parse_layered(parser, argv, env), layered_options(parser)[key].dest) == edge, key


def test_every_limit_range_fits_its_wire_field() -> None:
    """GetInfo can report any value a flag accepts (a uint32 count of 2**32 would fail there)."""
    widest = {
        FieldDescriptor.TYPE_UINT32: (1 << 32) - 1,
        FieldDescriptor.TYPE_UINT64: (1 << 64) - 1,
        FieldDescriptor.TYPE_DOUBLE: float("inf"),
    }
    for limit in Limits.flags():
        wire = rknn_pb2.Limits.DESCRIPTOR.fields_by_name[limit.name]
        assert limit.bounds.low >= 0 and limit.bounds.high <= widest[wire.type], limit.name


def test_help_shows_each_range() -> None:
    text = " ".join(serve_parser().format_help().split())
    for limit in Limits.flags():
        shown = f"{limit.bounds.show(limit.bounds.low)} to {limit.bounds.show(limit.bounds.high)}"
        assert shown in text, limit.flag
