"""A model folder of --model-repository is hostile content (issue 25, finding 1): nothing its writer
does while the daemon reads it makes the daemon follow a link, block on a pipe or read without bound.

The attack: a folder `m` whose model keeps a tensor as external data in `secret` (a harmless decoy
beside it), and `m_link`, a link to a folder holding the real secret (and a copy of the model). While
the daemon imports `m`, its writer swaps the two; an import that opens `root/m/<file>` by path again
then reads the real secret into the cache, and an inference returns it. Here the swap is made certain,
not raced: `open_hook` holds the daemon inside its open() of the model file while the test changes the
folder. Each case runs against a live daemon serving the repository over v2 REST.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rknn_server.protocols.kserve.repository import MAX_CONFIG_BYTES
from rknn_server.testing import clean_environ
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon
from tests.models import small_cnn
from tests.reliability import open_hook
from tests.reliability.hostile_models import SIZE, reader_model

SECRET = b"TOPSECRT"  # what the attacker must not get: SIZE bytes, read by the model as its tensor
DECOY = b"harmless"
HUGE = 1 << 30  # a sparse config.toml: nothing on disk, a gigabyte to whoever reads it whole
REPLY_TIMEOUT_S = 60

needs_hook = pytest.mark.skipif(bool(open_hook.available()), reason=open_hook.available() or "-")


@dataclass
class Served:
    running: MetricsDaemon
    root: Path  # the repository
    target: Path  # outside it: the secret, and a copy of the model beside it

    @property
    def log(self) -> str:
        return self.running.daemon.log_text()

    def post(self, route: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            f"{self.running.base}{route}", data=json.dumps(body or {}).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=REPLY_TIMEOUT_S) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def load(self, name: str) -> tuple[int, str]:
        status, body = self.post(f"/v2/repository/models/{name}/load")
        return status, str(body.get("error", ""))

    def read_tensor(self, name: str) -> bytes:
        """What the model's external tensor holds in the daemon (a run with zeros returns it)."""
        x = {"name": "x", "datatype": "UINT8", "shape": [SIZE], "data": [0] * SIZE}
        status, body = self.post(f"/v2/models/{name}/infer", {"inputs": [x]})
        assert status == 200, body
        (output,) = body["outputs"]
        return bytes(np.asarray(output["data"]).astype(np.uint8))

    def still_serves(self) -> None:
        x = {"name": "input", "datatype": "FP32", "shape": [1, 3, 16, 16], "data": [0.5] * 768}
        status, body = self.post("/v2/models/cnn/infer", {"inputs": [x]})
        assert status == 200, body

    def attack(self, name: str) -> Path:
        """A model folder whose tensor reads `secret` (the decoy), and `<name>_link` to the target."""
        folder = self.root / name
        folder.mkdir()
        (folder / "model.onnx").write_bytes(reader_model("secret", "initializer"))
        (folder / "secret").write_bytes(DECOY)
        (self.root / f"{name}_link").symlink_to(self.target, target_is_directory=True)
        return folder

    def assert_no_secret(self, *answers: object) -> None:
        for text in (*map(str, answers), self.log):
            assert SECRET.decode() not in text and str(self.target) not in text


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("repository-attacks")
    root = folder / "repository"
    (root / "cnn").mkdir(parents=True)
    small_cnn(root / "cnn" / "model.onnx")
    target = folder / "target"
    target.mkdir()
    (target / "secret").write_bytes(SECRET)
    (target / "model.onnx").write_bytes(reader_model("secret", "initializer"))
    running = start_metrics_daemon(folder, "--model-repository", str(root))
    yield Served(running, root, target)
    assert running.daemon.stop() == 0


class AtDaemonOpen:
    """An open_hook callback: `change` once, while the daemon waits inside its first open of `file`."""

    def __init__(self, file: str, change: Callable[[], None]) -> None:
        self.file = file
        self.change = change
        self.done = threading.Event()

    def __call__(self, name: str, pid: int) -> None:
        if pid != os.getpid() and name == self.file and not self.done.is_set():
            self.done.set()
            self.change()


def _swap_folder(served: Served, name: str) -> Callable[[], None]:
    def change() -> None:  # what the attacker's inotify watcher did: m <-> m_link
        os.rename(served.root / name, served.root / f"{name}_orig")
        os.rename(served.root / f"{name}_link", served.root / name)

    return change


def _replace_secret(folder: Path, make: Callable[[Path], None]) -> Callable[[], None]:
    def change() -> None:
        os.unlink(folder / "secret")
        make(folder / "secret")

    return change


@needs_hook
def test_a_folder_swapped_for_a_link_during_its_import_serves_only_its_own_bytes(served: Served) -> None:
    folder = served.attack("swapped")
    hook = AtDaemonOpen("model.onnx", _swap_folder(served, "swapped"))
    with open_hook.hold_opens(folder, hook):
        status, error = served.load("swapped")
    assert hook.done.is_set(), "the daemon never opened the model while the hook held it"
    assert (served.root / "swapped").is_symlink()  # the swap happened, mid-import
    assert status == 200, error
    assert served.read_tensor("swapped") == DECOY  # the folder it opened, not the one swapped in
    again = served.load("swapped")  # the name is now a link: no model
    assert again[0] == 404 and "not a symbolic link" in again[1], again
    served.assert_no_secret(error, again)
    served.still_serves()


@needs_hook
@pytest.mark.parametrize(
    ("kind", "make", "expected"),
    [
        ("link", lambda path: path.symlink_to(path.parents[2] / "target" / "secret"), "is a symbolic link"),
        ("pipe", os.mkfifo, "is a named pipe"),
    ],
)
def test_a_file_swapped_during_the_import_is_refused_without_waiting(
    served: Served, kind: str, make: Callable[[Path], None], expected: str
) -> None:
    """A link or a named pipe put in place of a file the daemon listed: refused, and a pipe does not
    hold the import in open() (it has no writer: a blocking open would wait forever)."""
    name = f"file_{kind}"
    folder = served.attack(name)
    hook = AtDaemonOpen("model.onnx", _replace_secret(folder, make))
    with open_hook.hold_opens(folder, hook):
        status, error = served.load(name)
    assert hook.done.is_set()
    assert status == 400 and f"model {name!r}: 'secret' {expected}" in error, (status, error)
    served.assert_no_secret(error)
    served.still_serves()


def test_links_anywhere_in_the_repository_are_refused(served: Served) -> None:
    (served.root / "alias").symlink_to(served.target, target_is_directory=True)
    inner = served.root / "inner"
    inner.mkdir()
    (inner / "model.onnx").write_bytes(reader_model("secret", "initializer"))
    (inner / "secret").symlink_to(served.target / "secret")
    alias, linked = served.load("alias"), served.load("inner")
    assert alias[0] == 404 and "not a symbolic link" in alias[1], alias
    assert linked[0] == 400 and "model 'inner': 'secret' is a symbolic link" in linked[1], linked
    _, index = served.post("/v2/repository/index")
    assert "alias" not in str(index)
    served.assert_no_secret(alias, linked, index)
    served.still_serves()


def test_a_named_pipe_in_a_model_folder_is_refused_at_load(served: Served) -> None:
    folder = served.root / "piped"
    folder.mkdir()
    small_cnn(folder / "model.onnx")
    os.mkfifo(folder / "config.toml")
    status, error = served.load("piped")
    assert status == 400 and "model 'piped': 'config.toml' is a named pipe" in error, error
    served.still_serves()


def test_a_named_pipe_in_a_model_folder_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "repository" / "piped"
    folder.mkdir(parents=True)
    small_cnn(folder / "model.onnx")
    os.mkfifo(folder / "weights.bin")
    args = [sys.executable, "-m", "rknn_server", "--runtime", "host", "--listen", "tcp://127.0.0.1:0"]
    args += ["--model-cache", str(tmp_path / "cache"), "--model-repository", str(tmp_path / "repository")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, env=clean_environ())
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model 'piped': 'weights.bin' is a named pipe" in done.stderr


class PeakMemory:
    """Growth of the daemon's peak resident memory (VmHWM, reset when made) from /proc."""

    def __init__(self, pid: int) -> None:
        self.status = Path(f"/proc/{pid}/status")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.start = self._kib("VmRSS")

    def _kib(self, key: str) -> int:
        line = next(line for line in self.status.read_text().splitlines() if line.startswith(f"{key}:"))
        return int(line.split()[1])

    def growth(self) -> int:
        return (self._kib("VmHWM") - self.start) * 1024


def _grow(path: Path) -> Callable[[], None]:
    return lambda: os.truncate(path, HUGE)


@pytest.mark.parametrize("when", ["at rest", "after it was listed"])
def test_an_oversized_config_is_refused_unread(served: Served, when: str) -> None:
    """A sparse 1 GiB config.toml, there from the start or grown once the daemon listed the folder
    (its size checked) and is opening it: refused, and the daemon's memory does not grow by it."""
    if when != "at rest" and open_hook.available():
        pytest.skip(open_hook.available())
    name = "huge_" + when.split()[0]
    folder = served.root / name
    folder.mkdir()
    small_cnn(folder / "model.onnx")
    config = folder / "config.toml"
    config.write_text("")
    peak = PeakMemory(served.running.daemon.pid)
    if when == "at rest":
        os.truncate(config, HUGE)
        status, error = served.load(name)
    else:
        hook = AtDaemonOpen("config.toml", _grow(config))
        with open_hook.hold_opens(folder, hook):
            status, error = served.load(name)
        assert hook.done.is_set()
    assert peak.growth() < 64 << 20, f"the daemon's peak memory grew by {peak.growth() >> 20} MiB"
    assert status == 400 and f"'config.toml' is {HUGE} bytes, over {MAX_CONFIG_BYTES}" in error, error
    served.still_serves()
