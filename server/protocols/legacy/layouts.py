"""Where each field sits in the messages of one toolkit release (the client's compiled struct sizes).

The toolkit sends no version of its own and checks every ack's size against its compiled one, so a
release's constants are data: `RELEASES` maps a toolkit version to its `Layout`. All offsets are from
the start of a message (after the u32 length). `tools/legacy_constants.py` reads them out of a
release's `librknn_api.so`.

2.3.2's library is 2.5.0's code byte for byte (only its version string differs), so both releases
share one layout and nothing a client sends tells them apart. A client of a release with other sizes
is recognised by the size of its MsgRun or MsgIoctl request (see `request_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rknn_server.protocols.legacy.wire import Command


@dataclass(frozen=True)
class Layout:
    toolkit: str
    # The fixed sizes of the client's MsgRun and MsgIoctl requests (a release with other structs sends
    # other sizes: the daemon refuses such a client with a crash report instead of misreading it).
    run_request_bytes: int = 0x478
    ioctl_request_bytes: int = 0x79
    # Acks of fixed size: version (text at TEXT_AT), load, set core; unload and the inputs' error ack;
    # the crash report (text at TEXT_AT).
    short_ack_bytes: int = 0x170
    bare_ack_bytes: int = 0x70
    crash_bytes: int = 0x1070
    text_at: int = 0x70
    version_text_bytes: int = 0x100
    # MsgIoctl ack: ack at 0x6c, echoed subcommand at 0x70, u64 data length at 0x74, data from
    # IOCTL_DATA_AT, then one more (zero) byte. After loading (the client's reader thread) the data is a
    # u64 (a duration, or the text's length) and from RUN_IOCTL_TEXT_AT a text in its buffer.
    ioctl_data_at: int = 0x7C
    run_ioctl_text_at: int = 0x84
    memory_text_bytes: int = 1024
    model_info_bytes: int = 104985
    dynamic_range_bytes: int = 4228852
    # MODEL_INFO: u32 n_input, input records, u32 n_output, output records, a 20-byte row per input.
    max_tensors: int = 128
    record_bytes: int = 0x15A
    n_input_at: int = 0x7C
    inputs_at: int = 0x80
    n_output_at: int = 0xAD91
    outputs_at: int = 0xAD95
    input_flags_at: int = 0x15A99
    # MsgMultiInput: u32 n at 0x6c, u32 size[], u32 offset[], u8 fmt[], u8 type[], u8 pass_through[], data.
    input_count_at: int = 0x6C
    input_sizes_at: int = 0x70
    input_offsets_at: int = 0x270
    input_formats_at: int = 0x470
    input_types_at: int = 0x4F0
    input_pass_through_at: int = 0x570
    input_data_at: int = 0x5F0
    # INPUT_DYNAMIC_RANGE (message offsets; the 0x6c data bytes before are not read by the client):
    # u32 n_input, u32 is_dynamic (the client sends MsgSetInputShape only when it is set), then one
    # record per input (see the DYNAMIC_* fields below).
    dynamic_count_at: int = 0xE8
    dynamic_flag_at: int = 0xEC
    dynamic_records_at: int = 0xF0
    dynamic_record_bytes: int = 0x810D
    # MsgSetInputShape: u32 n at 0x6c, the client's rknn_tensor_attr of each input from 0x70 (records
    # of ATTR_BYTES, the ATTR_* fields below). Its ack: u32 ack at 0x6c, the inputs' current attributes
    # (u32 n at 0x70, records from 0x74), the outputs' (u32 n at 0xb4f4, records from 0xb4f8).
    shape_request_bytes: int = 0xB4F0
    shape_count_at: int = 0x6C
    shape_records_at: int = 0x70
    shape_ack_bytes: int = 0x16978
    shape_ack_inputs_at: int = 0x70
    shape_ack_outputs_at: int = 0xB4F4
    # MsgFinish: u64 frame id, u32 result, u32 n_output, u32 len[], u32 offset[], data.
    finish_lengths_at: int = 0x7C
    finish_offsets_at: int = 0x27C
    finish_data_at: int = 0x47C

    def request_bytes(self, command: int) -> int | None:
        """The size this release's client gives a request of fixed size (None: any size)."""
        sizes: dict[int, int] = {
            Command.RUN: self.run_request_bytes,
            Command.IOCTL: self.ioctl_request_bytes,
            Command.SET_INPUT_SHAPE: self.shape_request_bytes,
        }
        return sizes.get(command)


# Record fields (offsets inside one MODEL_INFO record).
NAME_BYTES = 0x100
N_DIMS_AT = 0x100
DIMS_AT = 0x101
MAX_DIMS = 16
FORMAT_AT = 0x141
TYPE_AT = 0x142
QUANT_AT = 0x143
FL_AT = 0x144
ZERO_POINT_AT = 0x145
SCALE_AT = 0x149
W_STRIDE_AT = 0x14D  # u32, then u32 size_with_stride at 0x151

# Fields of an INPUT_DYNAMIC_RANGE record (librknnrt's rknn_input_range, packed, name last).
DYNAMIC_INDEX_AT = 0x0  # u32, then u32 shape_number
DYNAMIC_FORMAT_AT = 0x8  # u8
DYNAMIC_N_DIMS_AT = 0x9  # u32
DYNAMIC_RANGE_AT = 0xD  # u32 dyn_range[MAX_SHAPES][MAX_DIMS]
DYNAMIC_NAME_AT = 0x800D
MAX_SHAPES = 512

# Fields of the protocol's tensor attribute (librknnrt's rknn_tensor_attr, packed: enums as bytes),
# as MsgSetInputShape and its ack carry it.
ATTR_BYTES = 0x169
ATTR_INDEX_AT = 0x0  # u32, then u32 n_dims, u32 dims[16]
ATTR_DIMS_AT = 0x8
ATTR_NAME_AT = 0x48
ATTR_N_ELEMS_AT = 0x148  # u32, then u32 size
ATTR_FORMAT_AT = 0x150  # u8 fmt, u8 type, u8 qnt_type, i8 fl, i32 zp, f32 scale
ATTR_STRIDES_AT = 0x15C  # u32 w_stride, u32 size_with_stride, u8 pass_through, u32 h_stride

RELEASES = {version: Layout(version) for version in ("2.3.2", "2.5.0")}
DEFAULT_VERSION = "2.5.0"
DEFAULT = RELEASES[DEFAULT_VERSION]


def releases_sending(command: int, size: int) -> list[str]:
    """The known releases whose client sends this request with this size."""
    return [version for version, layout in RELEASES.items() if layout.request_bytes(command) == size]
