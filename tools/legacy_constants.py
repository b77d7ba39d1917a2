"""Read one RKNN-Toolkit2 release's protocol constants out of its `librknn_api.so`.

Usage: python tools/legacy_constants.py PATH/TO/librknn_api.so

Prints a `Layout(...)` entry for `server/protocols/legacy/layouts.py`: adding a toolkit release is data, not
code. It disassembles three exported functions with binutils' objdump (x86-64 library, Intel
syntax) and picks the sizes the client checks and the offsets it reads or writes:
  rknn_init2        the acks' fixed sizes, the MODEL_INFO and INPUT_DYNAMIC_RANGE data lengths and
                    the MODEL_INFO table offsets (record stride, counts, per-input rows);
  rknn_inputs_set   the MsgMultiInput arrays (u32 sizes and offsets, u8 formats, types and
                    pass-through flags, in that field order) and where the data starts;
  rknn_outputs_get  the MsgFinish length and offset arrays (the data follows them);
  rknn_run, rknn_query  the sizes of the MsgRun and MsgIoctl requests (the size each passes to the
                    buffer it allocates for the message), by which a client of this release is known.
A value it cannot find is reported and left to the default, never guessed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

IMM = r"(0x[0-9a-f]+)"


def disassemble(library: Path, function: str) -> str:
    return subprocess.run(
        ["objdump", "-d", "-M", "intel", "--no-show-raw-insn", f"--disassemble={function}", str(library)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def values(pattern: str, text: str) -> list[int]:
    return [int(v, 16) for v in re.findall(pattern, text)]


def release_version(library: Path) -> str:
    found = re.search(rb"(\d+\.\d+\.\d+) \([0-9a-f]+ build@", library.read_bytes())
    return found.group(1).decode() if found else "unknown"


def request_size(library: Path, function: str) -> int | None:
    """The message size `function` allocates most often (the size argument, edx, of __buf_create_and_map)."""
    sizes = Counter(
        values(
            rf"mov\s+edx,{IMM}\n(?:[^\n]*\n){{0,8}}?[^\n]*__buf_create_and_map",
            disassemble(library, function),
        )
    )
    return sizes.most_common(1)[0][0] if sizes else None


def extract(library: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    init = disassemble(library, "rknn_init2")
    sizes = Counter(values(rf"cmp\s+eax,{IMM}\n", init))
    short = [v for v, _ in sizes.most_common() if 0x100 <= v < 0x1000]
    crash = [v for v, _ in sizes.most_common() if v >= 0x1000]
    if short:
        found["short_ack_bytes"] = short[0]
    if crash:
        found["crash_bytes"] = crash[0]
    lengths = values(rf"cmp\s+rdx,{IMM}\n", init)
    if len(lengths) >= 2:
        found["model_info_bytes"], found["dynamic_range_bytes"] = lengths[0], lengths[1]
    counts = values(rf"cmp\s+DWORD PTR \[rax\+{IMM}\],0x0\n", init)
    if len(counts) >= 2:
        found["n_input_at"], found["n_output_at"] = counts[0], counts[1]
        found["inputs_at"], found["outputs_at"] = counts[0] + 4, counts[1] + 4
        table = init[init.index(f"[rax+{counts[0]:#x}],0x0") :]  # the input-record loop comes next
        strides = [v for v in values(rf"add\s+r\w+,{IMM}\n", table) if 0x100 <= v < 0x1000]
        if strides:
            found["record_bytes"] = strides[0]
        rows = [v for v in values(rf"add\s+rax,{IMM}\n", init) if v > counts[1]]
        if rows:
            found["input_flags_at"] = rows[0]
    inputs = disassemble(library, "rknn_inputs_set")
    words = sorted(set(values(rf"\[rax\+rdx\*4\+{IMM}\]", inputs)))
    bytes_ = sorted(set(values(rf"\[rax\+rdx\*1\+{IMM}\]", inputs)))
    if len(words) == 2 and len(bytes_) == 4:
        found["input_sizes_at"], found["input_offsets_at"] = words
        found["input_count_at"] = words[0] - 4
        keys = ("input_formats_at", "input_types_at", "input_pass_through_at", "input_data_at")
        found.update(zip(keys, bytes_, strict=True))
    outputs = disassemble(library, "rknn_outputs_get")
    arrays = sorted(set(values(rf"\[r\w+\+r\w+\*4\+{IMM}\]", outputs)))
    if len(arrays) >= 2:
        lengths_at, offsets_at = arrays[0], arrays[1]
        found["finish_lengths_at"], found["finish_offsets_at"] = lengths_at, offsets_at
        found["finish_data_at"] = offsets_at + (offsets_at - lengths_at)
        found["max_tensors"] = (offsets_at - lengths_at) // 4
    for field, function in (("run_request_bytes", "rknn_run"), ("ioctl_request_bytes", "rknn_query")):
        size = request_size(library, function)
        if size is not None:
            found[field] = size
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    library = Path(argv[0])
    found = extract(library)
    fields = ", ".join(f"{name}={value:#x}" for name, value in sorted(found.items()))
    print(f'Layout("{release_version(library)}", {fields})')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
