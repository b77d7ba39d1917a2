"""`rknn_server --help`, a refused option and `rknn_server health --help` load only the option parser:
a container's HEALTHCHECK and a user on a Cortex-A55 board pay for the daemon's imports (gRPC, numpy,
asyncio, the runtimes) only when it is about to serve. Serving, it loads a door only where it opens it
and a runtime's model stack (onnx) only when it opens a model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rknn_server import cli

# Imports whose presence means the daemon (or its wire stack) was loaded.
HEAVY = ("numpy", "grpc", "asyncio", "structlog", "google.protobuf", "rknn_server.daemon", "onnxruntime")

PROBE = f"""
import json, sys
from {cli.__name__} import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({{"code": code, "loaded": sorted(m for m in HEAVY if m in sys.modules)}}))
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


# What the daemon imports only when a flag opens the door or a model is opened.
LAZY = (
    "onnx",
    "onnxruntime",
    "rknn_server.runtime.host_model",
    "rknn_server.runtime.rknnrt.backend",
    "rknn_server.protocols.http.endpoint",
    "rknn_server.protocols.kserve.rest",
)


def test_the_daemon_loads_no_runtime_and_no_optional_door_before_it_serves() -> None:
    script = f"import json, sys\nimport rknn_server.daemon\nLAZY = {LAZY!r}\n"
    script += "print(json.dumps(sorted(m for m in LAZY if m in sys.modules)))"
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


# The host runtime's backend is made at start; onnx and onnxruntime (a tenth of a second on a board)
# are its models' imports, loaded when the first model opens.
HOST_PROBE = """
import json, sys
from pathlib import Path
import numpy as np
from rknn_server.runtime.base import RuntimeOptions
from rknn_server.runtime.select import select_backend
backend, _ = select_backend("host", "", 1)
started = sorted(m for m in ("onnx", "onnxruntime") if m in sys.modules)
model = backend.open(Path(sys.argv[1]), RuntimeOptions())
shape = model.run([np.zeros(model.inputs[0].shape, np.float32)])[0].shape
print(json.dumps({"started": started, "opened": "onnx" in sys.modules, "shape": list(shape)}))
"""


def test_the_host_backend_starts_without_onnx_and_imports_it_to_open_a_model(cnn_model: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", HOST_PROBE, str(cnn_model)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["started"] == [], f"making the host backend imported {answer['started']}"
    assert answer["opened"] and answer["shape"][0] == 1
