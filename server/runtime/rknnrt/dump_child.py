"""The child process of a layer dump: load the model, run it once, exit (see layer_dumps).

Its environment already asks the runtime to dump every layer into a private directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rknn_server.board.platform import PlatformInfo
from rknn_server.runtime.base import BackendError, InputFormat, RuntimeOptions
from rknn_server.runtime.rknnrt.backend import RknnrtBackend


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text())
    plugin_dir = Path(request["plugin_dir"]) if request["plugin_dir"] else None
    backend = RknnrtBackend(Path(request["library"]), PlatformInfo(soc=request["soc"]), plugin_dir)
    with np.load(request["inputs"]) as saved:
        inputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    formats = [InputFormat(**fmt) for fmt in request["formats"]] if request["formats"] is not None else None
    model = backend.open(Path(request["model"]), RuntimeOptions(**request["options"]))
    try:
        model.run(inputs, formats)
    except BackendError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
