"""Per-layer tensors from the runtime's own dump files.

With RKNN_LOG_LEVEL=5 the runtime writes one .npy per layer, named like
`025_ConvClip_385_shape_1_384_14_14_float.npy`, into RKNN_DUMP_DIR. That setting is read when the
library starts, and it slows every run, so the capture happens in a child process (see dump_child)
with its own temporary directory, which is removed once the tensors have been read back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

import rknn_server
from rknn_proto.messages import LayerDump
from rknn_server.runtime.base import ExecutionError, InputFormat, RuntimeOptions

DUMP_LOG_LEVEL = "5"
_NAME_RE = re.compile(r"(\d+)_([A-Za-z0-9]+)_(.*)_shape_[\d_]*_[A-Za-z0-9]+")
_STDERR_TAIL = 2000


def parse_dump_name(stem: str, order: int) -> tuple[int, str, str]:
    """(index, op type, tensor name) from a dump file's stem; unknown shapes keep the whole stem."""
    match = _NAME_RE.fullmatch(stem)
    if match is None:
        return order, "", stem
    return int(match.group(1)), match.group(2), match.group(3)


def read_dumps(folder: Path) -> Iterator[LayerDump]:
    """The .npy files in `folder` in layer order, loaded one at a time."""
    files = sorted(folder.glob("*.npy"))
    for order, path in enumerate(files):
        index, op_type, name = parse_dump_name(path.stem, order)
        yield LayerDump(index=index, op_type=op_type, node_name=name, tensor_name=name, array=np.load(path))


def _child_env(dump_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["RKNN_LOG_LEVEL"] = DUMP_LOG_LEVEL
    env["RKNN_DUMP_DIR"] = str(dump_dir)
    package_parent = str(Path(rknn_server.__path__[0]).parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH", "")]))
    return env


def capture_layers(
    library: Path,
    model: Path,
    options: RuntimeOptions,
    soc: str,
    plugin_dir: Path | None,
    inputs: Sequence[np.ndarray],
    formats: Sequence[InputFormat] | None,
) -> Iterator[LayerDump]:
    """Run the model once in a child process with dumping on; yield its layers; clean up."""
    work = Path(tempfile.mkdtemp(prefix="rknn-dump-"))
    try:
        dump_dir = work / "dumps"
        dump_dir.mkdir()
        np.savez(work / "inputs.npz", *[np.asarray(array) for array in inputs])
        request = {
            "library": str(library),
            "model": str(model),
            "options": dataclasses.asdict(options),
            "soc": soc,
            "plugin_dir": str(plugin_dir) if plugin_dir is not None else None,
            "inputs": str(work / "inputs.npz"),
            "formats": [dataclasses.asdict(fmt) for fmt in formats] if formats is not None else None,
        }
        (work / "request.json").write_text(json.dumps(request))
        child = subprocess.run(
            [sys.executable, "-m", "rknn_server.runtime.rknnrt.dump_child", str(work / "request.json")],
            env=_child_env(dump_dir),
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode != 0:
            raise ExecutionError(f"layer dump run failed: {child.stderr[-_STDERR_TAIL:].strip()}")
        yield from read_dumps(dump_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
