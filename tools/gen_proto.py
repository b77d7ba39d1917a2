"""Regenerate the committed gRPC/protobuf code under proto/, or check that it is fresh (--check).

protoc is run with the virtual include path ``rknn_proto=proto`` so that the generated modules import
each other as ``rknn_proto.x`` rather than by bare name; it then writes under OUT/rknn_proto/, so we
generate into a temporary folder and copy the files over.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out: Path) -> list[Path]:
    sources = sorted(PROTO_DIR.glob("*.proto"))
    bin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-Irknn_proto={PROTO_DIR}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        *[f"rknn_proto/{p.name}" for p in sources],
    ]
    subprocess.run(cmd, check=True)
    return sorted((out / "rknn_proto").iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        stale = []
        for f in files:
            target = PROTO_DIR / f.name
            if args.check:
                if not target.exists() or not filecmp.cmp(f, target, shallow=False):
                    stale.append(f.name)
            else:
                shutil.copyfile(f, target)
        committed = {p.name for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        orphans = committed - {f.name for f in files}
        if args.check and (stale or orphans):
            print(
                f"generated code is stale: {sorted(stale + list(orphans))}; run 'make proto'", file=sys.stderr
            )
            return 1
    if args.check:
        print("generated code is fresh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
