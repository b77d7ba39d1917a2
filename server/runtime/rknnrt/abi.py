"""The rknn_api.h ABI (SDK 2.3.2) in ctypes: constants, enums, structs and prototypes.

The structs are built by one factory for two layouts: the native one used for calls, and the armhf
one (32-bit pointers and a 32-bit `rknn_context`) that tests check against a cross compiler from a
64-bit host. On a 32-bit ARM host the native layout is the armhf layout.
"""

from __future__ import annotations

import ctypes
import enum
import platform
from dataclasses import dataclass
from typing import Any

MAX_DIMS = 16
MAX_NAME_LEN = 256
MAX_DYNAMIC_SHAPE_NUM = 512
CUSTOM_STRING_LEN = 1024


class InitFlag(enum.IntFlag):
    PRIOR_HIGH = 0x0
    PRIOR_MEDIUM = 0x1
    PRIOR_LOW = 0x2
    ASYNC_MASK = 0x4
    COLLECT_PERF_MASK = 0x8
    MEM_ALLOC_OUTSIDE = 0x10
    SHARE_WEIGHT_MEM = 0x20
    COLLECT_MODEL_INFO_ONLY = 0x100
    EXECUTE_FALLBACK_PRIOR_DEVICE_GPU = 0x400
    ENABLE_SRAM = 0x800


class Query(enum.IntEnum):
    IN_OUT_NUM = 0
    INPUT_ATTR = 1
    OUTPUT_ATTR = 2
    PERF_DETAIL = 3
    PERF_RUN = 4
    SDK_VERSION = 5
    MEM_SIZE = 6
    CUSTOM_STRING = 7
    NATIVE_INPUT_ATTR = 8
    NATIVE_OUTPUT_ATTR = 9
    NATIVE_NHWC_INPUT_ATTR = 10
    NATIVE_NHWC_OUTPUT_ATTR = 11
    DEVICE_MEM_INFO = 12
    INPUT_DYNAMIC_RANGE = 13
    CURRENT_INPUT_ATTR = 14
    CURRENT_OUTPUT_ATTR = 15
    CURRENT_NATIVE_INPUT_ATTR = 16
    CURRENT_NATIVE_OUTPUT_ATTR = 17


class TensorType(enum.IntEnum):
    FLOAT32 = 0
    FLOAT16 = 1
    INT8 = 2
    UINT8 = 3
    INT16 = 4
    UINT16 = 5
    INT32 = 6
    UINT32 = 7
    INT64 = 8
    BOOL = 9
    INT4 = 10
    BFLOAT16 = 11


class QuantType(enum.IntEnum):
    NONE = 0
    DFP = 1
    AFFINE_ASYMMETRIC = 2


class TensorFormat(enum.IntEnum):
    NCHW = 0
    NHWC = 1
    NC1HWC2 = 2
    UNDEFINED = 3


class CoreMask(enum.IntEnum):
    AUTO = 0
    CORE_0 = 1
    CORE_1 = 2
    CORE_2 = 4
    CORE_0_1 = 3
    CORE_0_1_2 = 7
    ALL = 0xFFFF


ERROR_NAMES: dict[int, str] = {
    0: "RKNN_SUCC",
    -1: "RKNN_ERR_FAIL",
    -2: "RKNN_ERR_TIMEOUT",
    -3: "RKNN_ERR_DEVICE_UNAVAILABLE",
    -4: "RKNN_ERR_MALLOC_FAIL",
    -5: "RKNN_ERR_PARAM_INVALID",
    -6: "RKNN_ERR_MODEL_INVALID",
    -7: "RKNN_ERR_CTX_INVALID",
    -8: "RKNN_ERR_INPUT_INVALID",
    -9: "RKNN_ERR_OUTPUT_INVALID",
    -10: "RKNN_ERR_DEVICE_UNMATCH",
    -11: "RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL",
    -12: "RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION",
    -13: "RKNN_ERR_TARGET_PLATFORM_UNMATCH",
}


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"unknown error {code}")


CType = Any  # a ctypes scalar or array type; ctypes offers no common static type for them


@dataclass(frozen=True)
class Abi:
    """The struct types of one layout. Each struct class is named as its C typedef."""

    name: str
    context: CType
    input_output_num: type[ctypes.Structure]
    tensor_attr: type[ctypes.Structure]
    input_range: type[ctypes.Structure]
    perf_detail: type[ctypes.Structure]
    perf_run: type[ctypes.Structure]
    sdk_version: type[ctypes.Structure]
    mem_size: type[ctypes.Structure]
    custom_string: type[ctypes.Structure]
    tensor_mem: type[ctypes.Structure]
    input: type[ctypes.Structure]
    output: type[ctypes.Structure]
    init_extend: type[ctypes.Structure]
    run_extend: type[ctypes.Structure]
    output_extend: type[ctypes.Structure]

    def structs(self) -> tuple[type[ctypes.Structure], ...]:
        return (
            self.input_output_num,
            self.tensor_attr,
            self.input_range,
            self.perf_detail,
            self.perf_run,
            self.sdk_version,
            self.mem_size,
            self.custom_string,
            self.tensor_mem,
            self.input,
            self.output,
            self.init_extend,
            self.run_extend,
            self.output_extend,
        )


def _struct(c_name: str, fields: list[tuple[str, CType]]) -> type[ctypes.Structure]:
    return type(c_name, (ctypes.Structure,), {"_fields_": fields})


def build_abi(name: str, pointer: CType, context: CType) -> Abi:
    """Lay out every struct with the given pointer and `rknn_context` types (enums are 4-byte ints)."""
    u8, i8, u32, i32, u64, i64 = (
        ctypes.c_uint8,
        ctypes.c_int8,
        ctypes.c_uint32,
        ctypes.c_int32,
        ctypes.c_uint64,
        ctypes.c_int64,
    )
    enum_t = ctypes.c_int
    return Abi(
        name=name,
        context=context,
        input_output_num=_struct("rknn_input_output_num", [("n_input", u32), ("n_output", u32)]),
        tensor_attr=_struct(
            "rknn_tensor_attr",
            [
                ("index", u32),
                ("n_dims", u32),
                ("dims", u32 * MAX_DIMS),
                ("name", ctypes.c_char * MAX_NAME_LEN),
                ("n_elems", u32),
                ("size", u32),
                ("fmt", enum_t),
                ("type", enum_t),
                ("qnt_type", enum_t),
                ("fl", i8),
                ("zp", i32),
                ("scale", ctypes.c_float),
                ("w_stride", u32),
                ("size_with_stride", u32),
                ("pass_through", u8),
                ("h_stride", u32),
            ],
        ),
        input_range=_struct(
            "rknn_input_range",
            [
                ("index", u32),
                ("shape_number", u32),
                ("fmt", enum_t),
                ("name", ctypes.c_char * MAX_NAME_LEN),
                ("dyn_range", (u32 * MAX_DIMS) * MAX_DYNAMIC_SHAPE_NUM),
                ("n_dims", u32),
            ],
        ),
        perf_detail=_struct("rknn_perf_detail", [("perf_data", pointer), ("data_len", u64)]),
        perf_run=_struct("rknn_perf_run", [("run_duration", i64)]),
        sdk_version=_struct(
            "rknn_sdk_version",
            [("api_version", ctypes.c_char * 256), ("drv_version", ctypes.c_char * 256)],
        ),
        mem_size=_struct(
            "rknn_mem_size",
            [
                ("total_weight_size", u32),
                ("total_internal_size", u32),
                ("total_dma_allocated_size", u64),
                ("total_sram_size", u32),
                ("free_sram_size", u32),
                ("reserved", u32 * 10),
            ],
        ),
        custom_string=_struct("rknn_custom_string", [("string", ctypes.c_char * CUSTOM_STRING_LEN)]),
        tensor_mem=_struct(
            "rknn_tensor_mem",
            [
                ("virt_addr", pointer),
                ("phys_addr", u64),
                ("fd", i32),
                ("offset", i32),
                ("size", u32),
                ("flags", u32),
                ("priv_data", pointer),
            ],
        ),
        input=_struct(
            "rknn_input",
            [
                ("index", u32),
                ("buf", pointer),
                ("size", u32),
                ("pass_through", u8),
                ("type", enum_t),
                ("fmt", enum_t),
            ],
        ),
        output=_struct(
            "rknn_output",
            [("want_float", u8), ("is_prealloc", u8), ("index", u32), ("buf", pointer), ("size", u32)],
        ),
        init_extend=_struct(
            "rknn_init_extend",
            [
                ("ctx", context),
                ("real_model_offset", i32),
                ("real_model_size", u32),
                ("model_buffer_fd", i32),
                ("model_buffer_flags", u32),
                ("reserved", u8 * 112),
            ],
        ),
        run_extend=_struct(
            "rknn_run_extend",
            [("frame_id", u64), ("non_block", i32), ("timeout_ms", i32), ("fence_fd", i32)],
        ),
        output_extend=_struct("rknn_output_extend", [("frame_id", u64)]),
    )


def host_is_arm32() -> bool:
    """True where the C compiler defines __arm__: `rknn_context` is then 32 bits wide."""
    return ctypes.sizeof(ctypes.c_void_p) == 4 and platform.machine().lower().startswith("arm")


NATIVE = build_abi("native", ctypes.c_void_p, ctypes.c_uint32 if host_is_arm32() else ctypes.c_uint64)
ARMHF = build_abi("armhf", ctypes.c_uint32, ctypes.c_uint32)

_P = ctypes.c_void_p
_U32 = ctypes.c_uint32
_INT = ctypes.c_int

# name -> (restype, argtypes); pointers to structs travel as void* (ctypes.byref or addressof).
PROTOTYPES: dict[str, tuple[CType, tuple[CType, ...]]] = {
    "rknn_init": (_INT, (_P, _P, _U32, _U32, _P)),
    "rknn_dup_context": (_INT, (_P, _P)),
    "rknn_destroy": (_INT, (NATIVE.context,)),
    "rknn_query": (_INT, (NATIVE.context, _INT, _P, _U32)),
    "rknn_inputs_set": (_INT, (NATIVE.context, _U32, _P)),
    "rknn_run": (_INT, (NATIVE.context, _P)),
    "rknn_outputs_get": (_INT, (NATIVE.context, _U32, _P, _P)),
    "rknn_outputs_release": (_INT, (NATIVE.context, _U32, _P)),
    "rknn_set_core_mask": (_INT, (NATIVE.context, _INT)),
    "rknn_set_input_shapes": (_INT, (NATIVE.context, _U32, _P)),
    "rknn_create_mem": (_P, (NATIVE.context, _U32)),
    "rknn_destroy_mem": (_INT, (NATIVE.context, _P)),
    "rknn_set_io_mem": (_INT, (NATIVE.context, _P, _P)),
    "rknn_register_custom_ops": (_INT, (NATIVE.context, _P, _U32)),
}

# What every runtime library has; the rest is optional (librknnmrt lacks the general API).
REQUIRED_SYMBOLS = ("rknn_init", "rknn_destroy", "rknn_query", "rknn_run")
GENERAL_API_SYMBOLS = ("rknn_inputs_set", "rknn_outputs_get", "rknn_outputs_release")
ZERO_COPY_SYMBOLS = ("rknn_create_mem", "rknn_destroy_mem", "rknn_set_io_mem")


def declare(lib: ctypes.CDLL) -> frozenset[str]:
    """Set the prototypes of the symbols `lib` exports; returns the names it has."""
    present = set()
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            func = getattr(lib, name)
        except AttributeError:
            continue
        func.restype = restype
        func.argtypes = argtypes
        present.add(name)
    return frozenset(present)
