"""The project installed the way users install it: an sdist and the wheel built from it, installed
non-editable into a fresh venv, run from there (the editable checkout must not leak in).

The venv is made from the base interpreter without pip; its third-party dependencies come from the
test venv's site-packages through a `.pth` naming a folder of links to them, every entry of this
project (its dist-info, the editable finder, `.pth` files) left out, so only the wheel's own files
can provide rknn_proto, rknn_server and rknn_client. Offline: nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rknn_proto.ready import wait_tcp_address
from tests import models

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> the import package it is (src/ links them under these names).
PACKAGES = {"proto": "rknn_proto", "server": "rknn_server", "client": "rknn_client"}
_PROJECT_ENTRIES = ("rknn_", "__editable__")
_SECONDS = 180


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def run(self, *args: str, timeout: float = _SECONDS) -> subprocess.CompletedProcess[str]:
        """Run a program of the venv (bin/NAME) or `python -c CODE`, checked, output captured."""
        result = subprocess.run(
            [str(self.root / "bin" / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,  # not the checkout: its folders must not be importable by accident
            # ... nor a labgrid lab of the machine's (LG_COORDINATOR) reachable by its farm plugin
            env={k: v for k, v in os.environ.items() if not k.startswith("LG_")},
            check=False,
        )
        assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
        return result


def _source_files() -> set[str]:
    """Every file the three packages consist of, as wheel paths (rknn_client/cli/commands.py, ...)."""
    files = set()
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                files.add(f"{package}/{path.relative_to(ROOT / folder).as_posix()}")
    return files


def _source_modules() -> list[str]:
    """Every importable module of the three packages, read from the source tree (not the install)."""
    names = []
    for wheel_path in sorted(_source_files()):
        parts = wheel_path.removesuffix(".py").split("/")
        if wheel_path.endswith(".py") and all(p.isidentifier() for p in parts) and parts[-1] != "__main__":
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _build(step: str, source: Path, dest: Path) -> str:
    """One PEP 517 step of setuptools' backend in `source`, without build isolation (offline);
    returns what the backend printed."""
    code = f"from setuptools import build_meta; build_meta.{step}({str(dest)!r})"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=_SECONDS,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(sdist, wheel built from that sdist, the backend's output): a file the sdist forgets is then
    missing from the wheel too."""
    work = tmp_path_factory.mktemp("build")
    tree = work / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", symlinks=True, ignore=shutil.ignore_patterns("*.egg-info"))
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    output = _build("build_sdist", tree, work / "dist")
    sdist = next((work / "dist").glob("*.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(work / "unpacked", filter="data")
    output += _build("build_wheel", next((work / "unpacked").iterdir()), work / "dist")
    return sdist, next((work / "dist").glob("*.whl")), output


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _distributions(requirements: list[str]) -> set[str]:
    """The installed distributions `requirements` (no markers) need, transitively, markers evaluated here."""
    names: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name not in names:
            names.add(name)
            extras = {"", *req.extras}
            for line in metadata.requires(req.name) or []:
                sub = Requirement(line)
                if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                    todo.append(sub)
    return names


def _top_level_entries(distributions: set[str]) -> set[str]:
    """The site-packages entries (packages, modules, dist-info folders) of these distributions."""
    entries = set()
    for dist in metadata.distributions(path=[str(_site_packages())]):
        if canonicalize_name(dist.metadata["Name"]) in distributions:
            entries |= {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}
    return entries


def _make_venv(work: Path, wheel: Path, entries: set[str]) -> Venv:
    """A venv of the base interpreter holding `wheel` (installed by pip, as a user would) and, through
    a `.pth`, links to the named entries of this venv's site-packages (never this project's)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(work / "venv")], check=True, timeout=_SECONDS)
    env = Venv(work / "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(env.python), "install", "--no-deps", "--no-index"]
    subprocess.run([*pip, "--no-compile", str(wheel)], check=True, capture_output=True, timeout=_SECONDS)
    deps = work / "deps"
    deps.mkdir()
    for name in entries:
        if not name.startswith(_PROJECT_ENTRIES) and not name.endswith(".pth"):
            (deps / name).symlink_to(_site_packages() / name)
    site = env.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout
    (Path(site.strip()) / "test_dependencies.pth").write_text(f"{deps}\n")
    return env


@pytest.fixture(scope="module")
def venv(built: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel with every third-party package of the test venv beside it."""
    entries = {entry.name for entry in _site_packages().iterdir()}
    return _make_venv(tmp_path_factory.mktemp("venv"), built[1], entries)


@pytest.fixture(scope="module")
def server_venv(built: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A board's install: the wheel with only what `[server]` needs (and pytest), no onnx."""
    distributions = _distributions(["rknn-server-oss[server]", "pytest"]) - {"rknn-server-oss"}
    assert "onnx" not in distributions and "grpcio" in distributions
    return _make_venv(tmp_path_factory.mktemp("server-venv"), built[1], _top_level_entries(distributions))


def test_the_wheel_holds_every_file_of_the_three_packages_and_builds_without_warnings(
    built: tuple[Path, Path, str],
) -> None:
    sdist, wheel, output = built
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if ".dist-info/" not in name}
    assert _source_files() - shipped == set(), "files of the packages missing from the wheel"
    assert shipped - _source_files() == set()
    with tarfile.open(sdist) as archive:
        in_sdist = {name.partition("/")[2] for name in archive.getnames()}
    assert {f"src/{name}" for name in _source_files()} <= in_sdist
    assert [line for line in output.splitlines() if "Warning" in line or line.startswith("!!")] == []


def test_the_installed_commands_start(venv: Venv) -> None:
    assert "deploy" in venv.run("rknn-client", "--help").stdout
    assert "--runtime" in venv.run("rknn_server", "--help").stdout


# Modules that another program's interpreter imports (labgrid's environments), with what they need
# there and rknn-client does not: found in the installed copy, not imported.
IMPORTED_ELSEWHERE = {"rknn_client.farm.labgrid_driver": "labgrid"}


def test_every_module_imports_from_the_installed_copy(venv: Venv) -> None:
    code = (
        "import importlib, importlib.util, json, sys\n"
        f"elsewhere = {sorted(IMPORTED_ELSEWHERE)!r}\n"
        "print(json.dumps({n: importlib.util.find_spec(n).origin if n in elsewhere\n"
        "                  else importlib.import_module(n).__file__ for n in sys.argv[1:]}))"
    )
    modules = _source_modules()
    files = json.loads(venv.run("python", "-c", code, *modules).stdout)
    assert sorted(files) == sorted(modules)
    outside = {name: file for name, file in files.items() if not Path(file).is_relative_to(venv.root)}
    assert outside == {}, "modules imported from outside the fresh venv"


_CLIENT = """
import json, sys
import numpy as np
import rknn_client
from rknn_client import RKNN
model, url, image, out = sys.argv[1:]
rknn = RKNN(toolkit="host")
rknn.config(target_platform="rk3588")
assert rknn.load_onnx(model) == 0 and rknn.build(do_quantization=False) == 0
assert rknn.init_runtime(target=None, device_id=url) == 0
outputs = rknn.inference(inputs=[np.load(image)])
assert outputs is not None
rknn.release()
np.save(out, outputs[0])
print(json.dumps({"client": rknn_client.__file__}))
"""


@contextlib.contextmanager
def _installed_daemon(venv: Venv, tmp_path: Path, *args: str) -> Iterator[str]:
    """The venv's `rknn_server` on a free loopback port until the block ends; yields its URL."""
    log_path = tmp_path / "daemon.log"
    command = [str(venv.root / "bin" / "rknn_server"), *args, "--model-cache", str(tmp_path / "cache")]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*command, "--listen", "tcp://127.0.0.1:0"], stdout=subprocess.PIPE, stderr=log, text=True
        )
    try:
        assert process.stdout is not None
        address = wait_tcp_address(process.stdout, 60)
        assert address, log_path.read_text()
        yield f"tcp://{address}"
    finally:
        process.terminate()
        process.wait(30)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture
def installed_daemon(venv: Venv, tmp_path: Path) -> Iterator[str]:
    """The installed daemon on the host runtime."""
    with _installed_daemon(venv, tmp_path, "--runtime", "host") as url:
        yield url


def test_the_demo_flow_runs_on_the_installed_daemon_and_client(
    venv: Venv, installed_daemon: str, tmp_path: Path
) -> None:
    model = models.small_cnn(tmp_path / "cnn.onnx")
    image = np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    np.save(tmp_path / "image.npy", image)
    args = [str(model), installed_daemon, str(tmp_path / "image.npy"), str(tmp_path / "out.npy")]
    said = json.loads(venv.run("python", "-c", _CLIENT, *args).stdout.splitlines()[-1])
    assert Path(said["client"]).is_relative_to(venv.root)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = session.run(None, {"input": image.transpose(2, 0, 1)[np.newaxis].astype(np.float32)})[0]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=1e-4, rtol=1e-4)


def test_a_server_only_install_runs_pytest_and_the_daemon_without_onnx(
    server_venv: Venv, tmp_path: Path, stub_lib: Path
) -> None:
    """The farm plugin (a pytest11 entry point, loaded by every pytest run there) and `import
    rknn_client` work without the client's dependencies, and the daemon serves on the rknnrt runtime."""
    (server_venv.root / "test_light.py").write_text(
        "import sys\n\n"
        "def test_light():\n    import rknn_client\n    assert 'onnx' not in sys.modules\n\n"
        "def test_farm_fixture(rknn_farm):\n    pass\n"
    )
    ran = server_venv.run("python", "-m", "pytest", "-p", "no:cacheprovider", "-rs", "test_light.py")
    assert "rknn-server-oss" in ran.stdout and "1 passed, 1 skipped" in ran.stdout, ran.stdout
    assert "no RKNN farm" in ran.stdout
    probe = "import sys, rknn_server.cli, rknn_server.daemon; print([m for m in sys.modules if 'onnx' in m])"
    assert server_venv.run("python", "-c", probe).stdout.strip() == "[]"
    with _installed_daemon(server_venv, tmp_path, "--runtime", "rknnrt", "--runtime-lib", str(stub_lib)):
        pass
