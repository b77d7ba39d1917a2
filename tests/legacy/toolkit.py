"""The real RKNN-Toolkit2 for the legacy tests: its interpreter, its bundled adb and a real `.rknn`.

Found where `rknn-client toolkit install` puts it (a venv with its stamp under ~/.cache/rknn_client)
or at RKNN_TOOLKIT2_PYTHON; the tests skip, saying why, when there is none.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rknn_client.toolkit.locate import STAMP
from rknn_client.user_cache import cache_root

PREFERRED_VERSION = "2.5.0"
# A tiny ONNX model, y = 2x + 1 on a 1x3x4x4 input, exported by the toolkit for rk3588; given the
# toolkit's dynamic_input (JSON), its height and width are free and the .rknn takes those shapes.
EXPORT_SCRIPT = """
import json
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

dynamic = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
dims = [1, 3, "h", "w"] if dynamic else [1, 3, 4, 4]
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
two = numpy_helper.from_array(np.full((1,), 2.0, np.float32), "two")
one = numpy_helper.from_array(np.full((1,), 1.0, np.float32), "one")
nodes = [helper.make_node("Mul", ["x", "two"], ["m"]), helper.make_node("Add", ["m", "one"], ["y"])]
model = helper.make_model(helper.make_graph(nodes, "tiny", [x], [y], [two, one]),
                          opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.save(model, sys.argv[1])

from rknn.api import RKNN

rknn = RKNN()
rknn.config(target_platform="rk3588", dynamic_input=dynamic)
assert rknn.load_onnx(sys.argv[1]) == 0
assert rknn.build(do_quantization=False) == 0
assert rknn.export_rknn(sys.argv[2]) == 0
rknn.release()
"""


@dataclass(frozen=True)
class Toolkit:
    python: Path
    version: str

    @property
    def package(self) -> Path:
        found = sorted(self.python.parent.parent.glob("lib/python3*/site-packages/rknn"))
        if not found:
            raise FileNotFoundError(f"no rknn package next to {self.python}")
        return found[0]

    @property
    def adb(self) -> Path:
        """The adb the toolkit ships (it uses it whenever /usr/bin/adb is absent)."""
        return self.package / "3rdparty/platform-tools/adb/linux-x86_64/adb"

    @property
    def api_library(self) -> Path:
        return self.package / "api/lib/linux-x86_64/librknn_api.so"


def installed_toolkits() -> list[Toolkit]:
    """Every toolkit venv `rknn-client toolkit install` left, 2.5.0 first, then the torch-stub kind
    (the same toolkit without 14 s of importing PyTorch per script)."""
    cache = cache_root()
    found = []
    for stamp in cache.glob(f"toolkit2-*/{STAMP}"):
        info = json.loads(stamp.read_text())
        python = Path(info.get("python", stamp.parent / "bin/python"))
        if python.exists():
            found.append((str(info.get("version", "")), "torch-stub" not in stamp.parent.name, python))
    found.sort(key=lambda item: (item[0] != PREFERRED_VERSION, item[1], item[0]))
    return [Toolkit(python, version) for version, _, python in found]


def find_toolkit(version: str | None = None) -> Toolkit | None:
    """RKNN_TOOLKIT2_PYTHON if set, else an installed toolkit (of `version` when given)."""
    explicit = os.environ.get("RKNN_TOOLKIT2_PYTHON")
    if explicit and version is None:
        return Toolkit(Path(explicit), os.environ.get("RKNN_TOOLKIT2_VERSION", PREFERRED_VERSION))
    return next((t for t in installed_toolkits() if version in (None, t.version)), None)


def export_tiny_rknn(
    toolkit: Toolkit, folder: Path, dynamic_input: list[list[list[int]]] | None = None
) -> Path:
    """A real .rknn from the real converter (a few seconds); with `dynamic_input` (the toolkit's
    config argument: one list of input shapes per model shape, NCHW) a dynamic-shape one."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "export.py"
    script.write_text(EXPORT_SCRIPT)
    out = folder / "tiny.rknn"
    extra = [json.dumps(dynamic_input)] if dynamic_input else []
    subprocess.run(
        [str(toolkit.python), str(script), str(folder / "tiny.onnx"), str(out), *extra],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


# The toolkit forwards the host's abstract socket @transfer_proxy, one name per network namespace:
# two toolkit sessions at once on one machine collide ("cannot bind listener: Address already in
# use"), whichever pytest worker or checkout they come from. A lock next to that name takes turns.
_TRANSFER_PROXY_LOCK = Path(tempfile.gettempdir()) / "rknn-tests-host-transfer_proxy.lock"


def run_on_board(
    toolkit: Toolkit, script: Path, args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """`script` in the toolkit's interpreter, reaching a board through the host's @transfer_proxy
    while no other test's toolkit holds it."""
    with _TRANSFER_PROXY_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(
            [str(toolkit.python), str(script), *args],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )
