"""Building the stand-in runtime libraries and writing models in the stub's own text format.

Model format (one `key value` per line after the `rknn-stub 1` header):

    input  NAME TYPE FMT DIMS [ZP SCALE]   TYPE: FP32 FP16 INT8 UINT8; FMT: NCHW NHWC UNDEFINED
                                           DIMS: comma-separated, e.g. 1,2,2,3
    output NAME TYPE FMT DIMS [ZP SCALE]   INT8 outputs are affine-quantized with ZP and SCALE
    a A / b B                              output[i] = A * input[i % n_inputs] + B per element (NHWC order)
    weight N / internal N / dma N          what RKNN_QUERY_MEM_SIZE reports
    perf_us N                              layer k of the perf table takes k * N us
    custom_string TEXT                     what RKNN_QUERY_CUSTOM_STRING reports
    requires_op OPTYPE                     rknn_run fails unless a custom op of that type was registered
    dynamic D1;D2;...                      input 0 takes these NHWC shapes, chosen by rknn_set_input_shapes

A real `.rknn` file (magic "RKNN") may carry a stand-in model appended after its own bytes, from a
line `rknn-stub 1` on: the stub reads that part, so the real toolkit accepts the file as a model.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

STUB_DIR = Path(__file__).parent / "stub"


def compiler() -> str:
    return os.environ.get("CC", "cc")


def build_stub(out_dir: Path, mrt: bool = False) -> Path:
    """Compile librknnrt.so (or, with mrt, librknnmrt.so without the general API) into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / ("librknnmrt.so" if mrt else "librknnrt.so")
    command = [
        compiler(),
        "-shared",
        "-fPIC",
        "-O1",
        "-Wall",
        "-Werror",
        "-o",
        str(out),
        str(STUB_DIR / "rknn_stub.c"),
    ]
    command += ["-DSTUB_MRT"] if mrt else []
    subprocess.run([*command, "-lm"], check=True, capture_output=True)
    return out


def build_plugin(out_dir: Path, file_name: str, op_type: str, with_entry: bool = True) -> Path:
    """Compile a custom-op plugin whose get_rknn_custom_op() returns an op of `op_type`."""
    source = out_dir / f"{file_name}.c"
    entry = (
        f'static rknn_custom_op op = {{1, 1, "{op_type}"}};\n'
        '__attribute__((visibility("default"))) rknn_custom_op* get_rknn_custom_op(void) { return &op; }\n'
    )
    source.write_text(f'#include "rknn_stub_api.h"\n{entry if with_entry else "int unrelated_symbol;"}\n')
    out = out_dir / file_name
    subprocess.run(
        [compiler(), "-shared", "-fPIC", "-I", str(STUB_DIR), "-o", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    return out


@dataclass(frozen=True)
class StubTensor:
    name: str
    type: str = "FP32"
    fmt: str = "NHWC"
    dims: tuple[int, ...] = (1, 2, 2, 3)
    zp: int = 0
    scale: float = 1.0

    def line(self, kind: str) -> str:
        dims = ",".join(str(d) for d in self.dims)
        return f"{kind} {self.name} {self.type} {self.fmt} {dims} {self.zp} {self.scale!r}"


def write_stub_model(
    path: Path,
    inputs: Sequence[StubTensor] = (StubTensor("in0"),),
    outputs: Sequence[StubTensor] = (StubTensor("out0"),),
    a: float = 2.0,
    b: float = 1.0,
    weight: int = 1024,
    internal: int = 512,
    dma: int = 4096,
    perf_us: int = 10,
    custom_string: str = "",
    requires_op: str = "",
    dynamic: Sequence[Sequence[int]] = (),
    container: bytes = b"",
) -> Path:
    """Write a stand-in model; with `container` (a real .rknn file's bytes), appended to that container."""
    lines = ["rknn-stub 1"]
    lines += [tensor.line("input") for tensor in inputs]
    lines += [tensor.line("output") for tensor in outputs]
    lines += [
        f"a {a!r}",
        f"b {b!r}",
        f"weight {weight}",
        f"internal {internal}",
        f"dma {dma}",
        f"perf_us {perf_us}",
    ]
    if custom_string:
        lines.append(f"custom_string {custom_string}")
    if requires_op:
        lines.append(f"requires_op {requires_op}")
    if dynamic:
        lines.append("dynamic " + ";".join(",".join(str(d) for d in shape) for shape in dynamic))
    text = "\n".join(lines) + "\n"
    path.write_bytes(container + b"\n" + text.encode() if container else text.encode())
    return path
