"""`rknn-client toolkit install`: RKNN-Toolkit2 in a venv of its own under the user's cache dir.

The default installs exactly what `pip install rknn-toolkit2==VERSION` gives, PyTorch with its CUDA
libraries included (gigabytes: torch 2.4 cannot even be imported without them). `torch_stub=True`
installs the toolkit's other pins and rknn-client's stand-in `torch` package instead (see
torch-stub/torch/__init__.py): everything but load_pytorch works, in a few hundred megabytes.
The venv is only used once its stamp is written, after `from rknn.api import RKNN` worked in it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from rknn_client.toolkit.locate import DEFAULT_VERSION, STAMP, managed_dir, venv_python

# CPython versions rknn-toolkit2 2.x has wheels for.
SUPPORTED_PYTHONS = ((3, 6), (3, 12))
IMPORT_TIMEOUT_S = 600.0


class InstallError(Exception):
    pass


def _python_version(python: str) -> tuple[int, int]:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as error:
        raise InstallError(f"{python} cannot be run: {error}") from None
    return int(out[0]), int(out[1])


def _name(requirement: str) -> str:
    """The project name a requirement string starts with ("torch <=2.4.0,>=1.10.1" -> "torch")."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    return match.group(0).lower() if match else ""


def _run(argv: list[str], what: str) -> str:
    """Run a step with its output shown as it comes (pip draws its own progress bars on a terminal)."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=None, stderr=None)
    if done.returncode != 0:
        raise InstallError(f"{what} failed (exit status {done.returncode}); its output is above")
    return what


def _ask(python: Path, code: str) -> str:
    return subprocess.run(
        [str(python), "-I", "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()


# What the stand-in leaves out, from the toolkit's own modules: in 2.5.0 only the PyTorch converter
# (rknn.base.convertor.torch2onnx) and load_checker's PyTorch check need real torch; build's
# reduce_reshape_op_around_concat rule calls torch.arange/split/cat, which the stand-in does with numpy;
# build, quantization, rknn.utils.onnx_edit, export and the simulator run (tests/toolkit/test_torch_stub.py
# runs the official onnx_edit flow on the example's two-input block). 2.3.2 also calls torch in gdq_quant, graph_optimizer
# and its extend ops (LSTM, RoiAlign, RFFT, Proposal, LayerNorm, ConvStreaming).
TORCH_STUB_LIMITS = (
    "with the stand-in for torch, load_pytorch (PyTorch models) needs real PyTorch: reinstall without "
    "--torch-stub for it; load_onnx/load_tflite/load_caffe/load_darknet/load_tensorflow, build (with "
    "quantization), rknn.utils.onnx_edit, export_rknn and the simulator work (toolkit 2.5.0; 2.3.2 also "
    "calls torch for quantized_algorithm='gdq' and in its LSTM, RoiAlign, RFFT, Proposal and LayerNorm ops)"
)


def _copy_stub(venv: Path) -> None:
    """Put rknn-client's stand-in `torch` package into the venv's site-packages (over an older one)."""
    site = Path(_ask(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    stub = Path(str(resources.files("rknn_client.toolkit").joinpath("torch-stub").joinpath("torch")))
    shutil.copytree(stub, site / "torch", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)


def install(
    version: str = DEFAULT_VERSION,
    *,
    wheelhouse: Path | None = None,
    torch_stub: bool = False,
    python: str | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> Path:
    """Create (or reuse, unless `force`) the managed venv; returns its directory. Raises InstallError."""
    target = managed_dir(version, torch_stub)
    if (target / STAMP).is_file() and not force:
        say(f"rknn-toolkit2 {version} is already installed in {target} (--force reinstalls it)")
        if torch_stub:
            if venv_python(target).exists():
                _copy_stub(venv_python(target))  # this rknn-client's stand-in, which may cover more
            say(TORCH_STUB_LIMITS)
        return target
    base = python or sys.executable
    found = _python_version(base)
    low, high = SUPPORTED_PYTHONS
    if not low <= found <= high:
        raise InstallError(
            f"{base} is Python {found[0]}.{found[1]}; rknn-toolkit2 has wheels for CPython "
            f"{low[0]}.{low[1]}-{high[0]}.{high[1]}: pass --python /path/to/python3.12 (or older)"
        )
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise InstallError(f"--wheelhouse {wheelhouse} is not a directory")
    steps = 4
    started = time.monotonic()
    if target.exists():
        shutil.rmtree(target)
    say(f"[1/{steps}] creating a venv for the toolkit in {target} (Python {found[0]}.{found[1]})")
    target.parent.mkdir(parents=True, exist_ok=True)
    _run([base, "-m", "venv", str(target)], "creating the venv")
    venv = venv_python(target)
    pip = [str(venv), "-m", "pip", "install", "--disable-pip-version-check"]
    if wheelhouse is not None:
        pip += ["--no-index", "--find-links", str(wheelhouse)]
    source = f"the wheelhouse {wheelhouse}" if wheelhouse is not None else "PyPI"
    toolkit = f"rknn-toolkit2=={version}"
    if torch_stub:
        say(f"[2/{steps}] installing {toolkit} from {source}, without PyTorch (--torch-stub)")
        _run([*pip, "--no-deps", toolkit], f"installing {toolkit}")
        wanted = json.loads(
            _ask(venv, "import importlib.metadata as m, json; print(json.dumps(m.requires('rknn-toolkit2')))")
        )
        pins = [req for req in wanted if _name(req) != "torch"]
        say(f"[3/{steps}] installing its other requirements: {', '.join(pins)}")
        _run([*pip, *pins], "installing the toolkit's requirements")
        _copy_stub(venv)
    else:
        say(
            f"[2/{steps}] installing {toolkit} and its requirements (PyTorch and CUDA libraries: several GB) from {source}"
        )
        _run([*pip, toolkit], f"installing {toolkit}")
        say(f"[3/{steps}] done installing packages")
    say(f"[4/{steps}] checking that `from rknn.api import RKNN` works")
    try:
        subprocess.run(
            [str(venv), "-I", "-c", "from rknn.api import RKNN"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            check=True,
        )
    except subprocess.CalledProcessError as error:
        last = (error.stderr.strip().splitlines() or ["no output"])[-1]
        raise InstallError(f"the toolkit was installed but does not import: {last}") from None
    except subprocess.TimeoutExpired:
        raise InstallError(f"importing the toolkit took over {IMPORT_TIMEOUT_S:g}s") from None
    stamp = {"version": version, "torch": "stub" if torch_stub else "real", "python": str(venv)}
    (target / STAMP).write_text(json.dumps(stamp) + "\n")
    say(f"rknn-toolkit2 {version} is ready in {target} ({time.monotonic() - started:.0f}s)")
    if torch_stub:
        say(TORCH_STUB_LIMITS)
    return target
