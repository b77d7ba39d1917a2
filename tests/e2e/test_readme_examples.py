"""The README's and docs/'s examples run as written (issue #29), once with the real RKNN-Toolkit2 visible
and once with it hidden: a user copies them whether or not the toolkit is installed.

Each ```python block and each command line of a ```sh block is read out of README.md and docs/*.md
and run in a folder of its own, as a user would run it, against a host-runtime daemon this module
starts. The test changes two things in a block: the board's address (`tcp://HOST:PORT`, the
`SERIAL_OR_tcp://...` placeholder, the docs' `tcp://board:50515`) becomes the daemon's, and, as that
board is the host runtime, `model.rknn` (a board's converted model) becomes `model.onnx`. The folder
holds the user's files the examples name (model.onnx, x.npy, photo.jpg, img.jpg, dataset.txt,
farm.toml). A line that serves until stopped (`rknn_server` with options) must print its `listening
on` line, then stop cleanly on SIGTERM. What cannot run here is in SKIPPED (a line or block) or
SKIPPED_BLOCKS (every line of a block), each with its reason; a defect still open is in DEFECTS
(strict xfail: it fails once the document is fixed, so the entry goes).

The toolkit is found in the user's cache folder (client/toolkit/locate.py): hidden by pointing
XDG_CACHE_HOME at an empty folder, and checked either way with `rknn-client toolkit status`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rknn_client.compat.toolkit_route import ENV_TOOLKIT
from rknn_client.toolkit.locate import ENV_PYTHON
from rknn_proto.ready import tcp_address
from rknn_server.testing import DaemonProcess, start_daemon
from tests import models
from tests.adb.fixtures import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(python|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_ADDRESS = re.compile(r"SERIAL_OR_tcp://\.\.\.|tcp://[\w.-]+:(?!0\b)\d+")
# A block or line (by its first line, stripped) that cannot run in CI, and why.
SKIPPED = {
    "make demo": "installs into .venv and runs the whole demo; `make demo` is its own CI check",
    "make test": "is this suite (it would run itself)",
    "rknn_server": "binds the default tcp://127.0.0.1:50515 and @rknn_server, which other runs may hold",
    "rknn_server --runtime host --soc rk3588": "binds the default tcp://127.0.0.1:50515 and @rknn_server",
    "rknn_server --isolation process": "binds the default tcp://127.0.0.1:50515 and @rknn_server",
    "rknn-client deploy --device SERIAL": "installs onto a real board over adb (tests/adb/test_deploy.py)",
    "rknn-client perf model.onnx --concurrency-range 1:8": "eight steps of measurement windows: minutes "
    "(tests/throughput runs the load test)",
    "rknn-client perf model.rknn --device tcp://board:50515 --concurrency-range 1:8": "eight steps of "
    "measurement windows: minutes (tests/throughput runs the load test)",
    "rknn-client perf model.rknn --device tcp://board:50515 --request-rate-range 10:50:10 --csv": "five "
    "steps of measurement windows: minutes (tests/throughput runs request-rate sweeps and their CSV)",
}
# Blocks none of whose lines can run here (by document and the block's first line), and why.
SKIPPED_BLOCKS = {
    "deploy.md: make wheel                                   # on the PC, in the clone: "
    "dist/rknn_server_oss-VERSION-py3-none-any.whl": "installs onto a board; make board-test does exactly "
    "these steps in emulated arm64/armhf Debian images (tests/board)",
    "load-testing.md: perf_analyzer -m <model> -u <board>:50515 -i grpc --concurrency-range 1:4 -f report.csv": (
        "the reader's model and board; tests/kserve/test_perf_analyzer.py runs both forms against the daemon"
    ),
    "farm.md: import pytest": "a test module for the farm's pytest plugin (tests/farm/test_pytest_plugin.py "
    "runs such a suite across three boards under xdist)",
    "metrics-and-inference-protocol.md: import numpy as np": "the token and the `resnet` model are the "
    "reader's; tritonclient lives in a venv of its own (make tritonclient) and tests/kserve/test_tritonclient.py "
    "makes these calls against the daemon",
    "toolkit-bridge.md: from rknn_client.toolkit import INSTALL_HINT, Missing, Reply, Toolkit, ToolkitBridge, "
    "locate": "an API summary with `...` for the arguments (tests/toolkit drives the bridge)",
}
# Documentation defects reported and not yet fixed: the block's first line -> what is wrong.
DEFECTS: dict[str, str] = {}
SERVE_TIMEOUT_S = 60
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Example:
    document: str
    language: str
    code: str
    block: str  # the first line of the block it is in

    @property
    def key(self) -> str:
        return self.code.strip().splitlines()[0].split("#")[0].strip() if self.language == "sh" else self.head

    @property
    def head(self) -> str:
        return self.code.strip().splitlines()[0].strip()


def documented_examples() -> list[Example]:
    """Each python block whole, each sh block line by line (a line is one command a user types); a line
    that is only a comment is not a command."""
    examples = []
    for document in DOCUMENTS:
        for language, body in _FENCE.findall(document.read_text()):
            name, first = document.name, body.strip().splitlines()[0]
            if language == "python":
                examples.append(Example(name, language, body, first))
                continue
            lines = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            examples += [Example(name, language, line, first) for line in lines]
    return examples


def _marked(example: Example) -> object:
    marks = []
    if example.key in SKIPPED:
        marks.append(pytest.mark.skip(reason=SKIPPED[example.key]))
    elif f"{example.document}: {example.block}" in SKIPPED_BLOCKS:
        marks.append(pytest.mark.skip(reason=SKIPPED_BLOCKS[f"{example.document}: {example.block}"]))
    if example.head in DEFECTS:
        marks.append(pytest.mark.xfail(reason=DEFECTS[example.head], strict=True))
    return pytest.param(example, id=f"{example.document}:{example.head[:60]}", marks=marks)


@pytest.fixture(scope="module")
def readme_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """The board the examples name: the SoC the first example targets."""
    root = tmp_path_factory.mktemp("readme-daemon")
    daemon = start_daemon(root / "cache", root / "daemon.log", ["--runtime", "host", "--soc", "rk3588"])
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory, readme_daemon: DaemonProcess) -> Path:
    """The files the examples name, as a user would have them."""
    folder = tmp_path_factory.mktemp("user-files")
    models.small_cnn(folder / "model.onnx")
    rng = np.random.default_rng(0)
    np.save(folder / "x.npy", rng.random((1, 3, 16, 16), dtype=np.float32))
    for name in ("photo.jpg", "img.jpg"):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / name)
    (folder / "dataset.txt").write_text("img.jpg\n")
    (folder / "farm.toml").write_text(
        f'[[device]]\nname = "b0"\naddress = "{readme_daemon.url}"\nlabels = {{ rack = "r1" }}\n'
    )
    return folder


@pytest.fixture(params=["toolkit", "no-toolkit"], scope="module")
def user_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A user's environment: the installed commands on PATH, no adb server of anyone's, the toolkit
    route left to its default, and the toolkit visible or hidden."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RKNN_SERVER")}
    env.pop(ENV_TOOLKIT, None)
    env.pop(ENV_PYTHON, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["ANDROID_ADB_SERVER_PORT"] = str(free_port())
    if request.param == "no-toolkit":
        env["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("empty-cache"))
    status = subprocess.run(
        ["rknn-client", "toolkit", "status"], env=env, capture_output=True, text=True, timeout=120
    )
    if request.param == "toolkit" and status.returncode != 0:
        pytest.skip(f"RKNN-Toolkit2 is not installed (make toolkit): {status.stdout}{status.stderr}")
    assert (status.returncode == 0) == (request.param == "toolkit"), status.stdout + status.stderr
    return env


def _copy_of(user_files: Path, folder: Path) -> Path:
    for source in user_files.iterdir():
        (folder / source.name).write_bytes(source.read_bytes())
    return folder


def _serve_until_stopped(line: str, cwd: Path, env: dict[str, str]) -> None:
    """A daemon line: it must say where it listens, then stop cleanly when asked to (run with `exec`,
    so that the signal reaches the daemon rather than the shell)."""
    process = subprocess.Popen(
        ["sh", "-c", f"exec {line}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        address = next((tcp_address(text) for text in process.stdout if tcp_address(text)), None)
        assert address, process.stderr.read() if process.stderr else ""
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=SERVE_TIMEOUT_S)
    assert code == 0, process.stderr.read() if process.stderr else ""


@pytest.mark.parametrize("example", [_marked(example) for example in documented_examples()])
def test_readme_example_runs_as_written(
    example: Example, readme_daemon: DaemonProcess, user_files: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    code = _ADDRESS.sub(readme_daemon.url, example.code).replace("model.rknn", "model.onnx")
    cwd = _copy_of(user_files, tmp_path)
    if example.language == "sh" and example.key.startswith("rknn_server") and " health " not in code:
        _serve_until_stopped(code, cwd, user_env)
        return
    argv = [sys.executable, "-c", code] if example.language == "python" else ["sh", "-c", code]
    run = subprocess.run(argv, cwd=cwd, env=user_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, f"{code}\nstdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"


def test_every_skip_names_an_example_the_documents_still_have() -> None:
    """A skip whose example was reworded or removed would silently skip nothing."""
    examples = documented_examples()
    keys = {example.key for example in examples} | {example.head for example in examples}
    blocks = {f"{example.document}: {example.block}" for example in examples}
    assert sorted(set(SKIPPED) - keys) == []
    assert sorted(set(SKIPPED_BLOCKS) - blocks) == []
