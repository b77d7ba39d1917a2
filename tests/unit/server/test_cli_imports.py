"""`rknn_server --help`, a refused option and `rknn_server health --help` load only the option parser:
a container's HEALTHCHECK and a user on a Cortex-A55 board pay for the daemon's imports (gRPC, numpy,
asyncio, the runtimes) only when it is about to serve."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Imports whose presence means the daemon (or its wire stack) was loaded.
HEAVY = ("numpy", "grpc", "asyncio", "structlog", "google.protobuf", "rknn_server.daemon", "onnxruntime")

PROBE = """
import json, sys
from rknn_server.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({"code": code, "loaded": sorted(m for m in HEAVY if m in sys.modules)}))
"""


def loaded_after(*argv: str) -> tuple[object, list[str]]:
    """(exit code, the heavy modules imported) of `rknn_server ARGV` in a fresh interpreter."""
    script = f"HEAVY = {HEAVY!r}\n{PROBE}"
    run = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=60, check=True
    )
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    return answer["code"], answer["loaded"]


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("serve", "--help"),
        ("health", "--help"),
        ("--max-sessions", "0"),  # out of its range: refused by the parser
        ("--no-legacy", "--legacy-listen", "unix-abstract:x"),  # contradictory: refused after parsing
    ],
)
def test_the_parser_alone_answers_without_loading_the_daemon(argv: tuple[str, ...]) -> None:
    code, loaded = loaded_after(*argv)
    assert code in (0, 2), code
    assert loaded == [], f"rknn_server {' '.join(argv)} imported {loaded}"


def test_the_probe_sees_the_daemon_when_it_is_loaded() -> None:
    """The probe itself can fail: importing the daemon shows up in what it reports."""
    script = f"HEAVY = {HEAVY!r}\nimport rknn_server.daemon\n{PROBE}"
    run = subprocess.run(
        [sys.executable, "-c", script, "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(run.stdout.strip().splitlines()[-1])["loaded"]
    assert {"numpy", "grpc", "rknn_server.daemon"} <= set(loaded)
