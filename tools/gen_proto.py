"""Regenerate the committed gRPC/protobuf code under proto/, or check that it is fresh (--check).

Every .proto under proto/ is generated: `rknn.proto` (the rknn.v1 contract) and the ones in
subfolders (`kserve/grpc_service.proto`, the open inference protocol). protoc is run with the virtual
include path ``rknn_proto=proto`` so that the generated modules import each other as ``rknn_proto.x``
rather than by bare name; it then writes under OUT/rknn_proto/, so we generate into a temporary folder
and copy the files over, each beside its .proto.
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
    """Generate every .proto into `out`; the generated files, relative to `out/rknn_proto`."""
    sources = sorted(p.relative_to(PROTO_DIR) for p in PROTO_DIR.rglob("*.proto"))
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
        *[f"rknn_proto/{p.as_posix()}" for p in sources],
    ]
    subprocess.run(cmd, check=True)
    generated = out / "rknn_proto"
    return sorted(p.relative_to(generated) for p in generated.rglob("*") if p.is_file())


def committed() -> set[Path]:
    return {
        p.relative_to(PROTO_DIR)
        for p in PROTO_DIR.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = Path(tmp) / "rknn_proto"
        files = generate(Path(tmp))
        stale = []
        for name in files:
            target = PROTO_DIR / name
            if args.check:
                if not target.exists() or not filecmp.cmp(generated / name, target, shallow=False):
                    stale.append(str(name))
            else:
                shutil.copyfile(generated / name, target)
        orphans = [str(p) for p in committed() - set(files)]
        if args.check and (stale or orphans):
            print(f"generated code is stale: {sorted(stale + orphans)}; run 'make proto'", file=sys.stderr)
            return 1
    if args.check:
        print("generated code is fresh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
