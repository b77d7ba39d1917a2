"""One model loaded into librknnrt (general API) or librknnmrt (zero-copy API)."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from rknn_proto.messages import (
    EvalMemoryResponse,
    EvalPerfResponse,
    LayerDump,
    TensorAttr,
    dequantize,
    quantize,
)
from rknn_server.board.platform import NPU_CORES, PlatformInfo
from rknn_server.runtime.base import (
    ExecutionError,
    InputError,
    InputFormat,
    InputShapes,
    ModelFormatError,
    ModelRuntime,
    RuntimeOptions,
    UnsupportedError,
    VersionInfo,
)
from rknn_server.runtime.rknnrt import abi, tensors
from rknn_server.runtime.rknnrt.layer_dumps import capture_layers
from rknn_server.runtime.rknnrt.library import RuntimeLibrary
from rknn_server.runtime.rknnrt.perf_text import parse_perf_detail
from rknn_server.runtime.rknnrt.plugins import Plugin

S = TypeVar("S", bound=ctypes.Structure)
log = logging.getLogger(__name__)

NO_LAYER_PERF_NOTE = (
    "{kind}: the runtime has no per-layer performance data on this platform; "
    "the total is wall-clock time around rknn_run"
)
PERF_RUN_MISSING_NOTE = "RKNN_QUERY_PERF_RUN unavailable; the total is wall-clock time around rknn_run"


def _mask_name(mask: abi.CoreMask) -> str:
    """The RKNNLite constant's name: CORE_0 -> NPU_CORE_0, AUTO -> NPU_CORE_AUTO."""
    return f"NPU_{mask.name}" if mask.name.startswith("CORE_") else f"NPU_CORE_{mask.name}"


def allowed_core_masks(cores: int) -> list[str]:
    """The toolkit's names of the masks a SoC with `cores` NPU cores takes."""
    usable = [
        mask
        for mask in abi.CoreMask
        if mask in (abi.CoreMask.AUTO, abi.CoreMask.ALL) or (cores > 1 and not mask & ~((1 << cores) - 1))
    ]
    return [_mask_name(mask) for mask in sorted(usable)]


def check_core_mask(soc: str, mask: int) -> None:
    """Refuse masks the SoC cannot honour (only RK3588 with 3 cores and RK3576 with 2 take masks)."""
    if mask in (abi.CoreMask.AUTO, abi.CoreMask.ALL) or not soc:
        return
    cores = NPU_CORES.get(soc)
    if cores is None:
        raise UnsupportedError(
            f"core_mask {mask:#x} refused: core_mask is only supported on rk3588 and rk3576, not on {soc} "
            f"(one NPU core); allowed there: {', '.join(allowed_core_masks(1))}"
        )
    if mask & ~((1 << cores) - 1):
        raise UnsupportedError(
            f"core_mask {mask:#x} names NPU cores that {soc} lacks: it has {cores} cores; "
            f"allowed: {', '.join(allowed_core_masks(cores))}"
        )


def init_flags(options: RuntimeOptions, general: bool) -> int:
    """rknn_init's flags for a session's options: sessions share a context's weights only when
    these agree."""
    flags = abi.InitFlag.PRIOR_HIGH
    if options.perf_debug and general:
        flags |= abi.InitFlag.COLLECT_PERF_MASK
    if options.fallback_prior_device.lower() == "gpu":
        flags |= abi.InitFlag.EXECUTE_FALLBACK_PRIOR_DEVICE_GPU
    return int(flags)


class RknnrtModel(ModelRuntime):
    """Not thread-safe (the daemon serialises calls per session)."""

    def __init__(
        self,
        library: RuntimeLibrary,
        model_path: Path,
        options: RuntimeOptions,
        probe: PlatformInfo,
        plugins: Sequence[Plugin] = (),
        plugin_dir: Path | None = None,
        sibling: RknnrtModel | None = None,
        family: threading.Lock | None = None,
    ) -> None:
        """Load the model, or, given a `sibling` session of the same file and init flags, duplicate
        its context (rknn_dup_context: the two share the model's weights in NPU memory). `family` is
        the lock its siblings' opens and closes take (a context is not duplicated while destroyed)."""
        self._library = library
        self._lib = library.cdll
        self._family = family or threading.Lock()
        self._path = model_path
        self._options = options
        self._probe = probe
        self._plugin_dir = plugin_dir
        self._general = library.has_general_api
        self._mems: list[int] = []
        self._io_bound = False
        self._last_wall_us = 0.0
        check_core_mask(probe.soc, options.core_mask)
        context = abi.NATIVE.context()
        if sibling is None or not self._dup(sibling, context):
            flags = init_flags(options, self._general)
            ret = self._lib.rknn_init(ctypes.byref(context), str(model_path).encode(), 0, flags, None)
            if ret < 0:
                raise ModelFormatError(f"rknn_init failed for {model_path.name}: {abi.error_name(ret)}")
        self._ctx: int | None = int(context.value)
        try:
            self._setup(plugins)
        except BaseException:
            self.close()
            raise

    # --- set-up ---------------------------------------------------------------------------------

    def _dup(self, sibling: RknnrtModel, context: ctypes._SimpleCData[int]) -> bool:
        """Whether `context` now shares the sibling's weights (else it loads the file itself)."""
        if "rknn_dup_context" not in self._library.symbols or sibling._ctx is None:
            return False
        source = abi.NATIVE.context(sibling._ctx)
        ret = self._lib.rknn_dup_context(ctypes.byref(source), ctypes.byref(context))
        if ret < 0:
            log.warning(
                "rknn_dup_context failed (%s); loading %s again", abi.error_name(ret), self._path.name
            )
            return False
        return True

    @property
    def is_open(self) -> bool:
        return self._ctx is not None

    def _setup(self, plugins: Sequence[Plugin]) -> None:
        self._register(plugins)
        if self._options.core_mask != abi.CoreMask.AUTO:
            if "rknn_set_core_mask" not in self._library.symbols:
                raise UnsupportedError("this runtime cannot select NPU cores (no rknn_set_core_mask)")
            ret = self._lib.rknn_set_core_mask(self._ctx, self._options.core_mask)
            if ret < 0:
                raise UnsupportedError(
                    f"core_mask {self._options.core_mask:#x} refused: {abi.error_name(ret)}"
                )
        io_num = self._query(abi.Query.IN_OUT_NUM, abi.NATIVE.input_output_num())
        self._in_attrs = [self._attr(abi.Query.INPUT_ATTR, i) for i in range(io_num.n_input)]
        self._out_attrs = [self._attr(abi.Query.OUTPUT_ATTR, i) for i in range(io_num.n_output)]
        self._ranges = [self._dynamic_range(i) for i in range(io_num.n_input)]
        self.inputs: Sequence[TensorAttr] = [
            tensors.tensor_attr(attr, ranges, is_input=True)
            for attr, ranges in zip(self._in_attrs, self._ranges, strict=True)
        ]
        self.outputs: Sequence[TensorAttr] = [tensors.tensor_attr(attr) for attr in self._out_attrs]
        self._current_shapes: list[tuple[int, ...]] = []

    def _register(self, plugins: Sequence[Plugin]) -> None:
        """Register each plugin's op with this context; a refused one is logged and skipped."""
        if plugins and "rknn_register_custom_ops" not in self._library.symbols:
            log.warning("%s cannot register custom operators; plugins ignored", self._library.path.name)
            return
        for plugin in plugins:
            ret = self._lib.rknn_register_custom_ops(self._ctx, plugin.op, 1)
            if ret < 0:
                log.warning("rknn_register_custom_ops fail for %s: %s", plugin.path.name, abi.error_name(ret))

    def _query(self, cmd: abi.Query, info: S) -> S:
        ret = self._lib.rknn_query(self._ctx, int(cmd), ctypes.byref(info), ctypes.sizeof(info))
        if ret < 0:
            raise ExecutionError(f"rknn_query({cmd.name}) failed: {abi.error_name(ret)}")
        return info

    def _attr(self, cmd: abi.Query, index: int) -> ctypes.Structure:
        attr = abi.NATIVE.tensor_attr()
        attr.index = index
        return self._query(cmd, attr)

    def _dynamic_range(self, index: int) -> tuple[tuple[int, ...], ...]:
        if "rknn_set_input_shapes" not in self._library.symbols:
            return ()
        info = abi.NATIVE.input_range()
        info.index = index
        ret = self._lib.rknn_query(
            self._ctx, int(abi.Query.INPUT_DYNAMIC_RANGE), ctypes.byref(info), ctypes.sizeof(info)
        )
        if ret < 0 or info.shape_number == 0:
            return ()
        count = min(int(info.shape_number), abi.MAX_DYNAMIC_SHAPE_NUM)
        return tuple(tuple(int(d) for d in info.dyn_range[s][: info.n_dims]) for s in range(count))

    # --- queries --------------------------------------------------------------------------------

    def sdk_version(self) -> VersionInfo | None:
        """API and driver strings as the runtime reports them for this context (None if it will not)."""
        try:
            info = self._query(abi.Query.SDK_VERSION, abi.NATIVE.sdk_version())
        except ExecutionError as exc:
            log.warning("%s", exc)
            return None
        return VersionInfo(
            api=info.api_version.decode(errors="replace"), driver=info.drv_version.decode(errors="replace")
        )

    def custom_string(self) -> str:
        return self._query(abi.Query.CUSTOM_STRING, abi.NATIVE.custom_string()).string.decode(
            errors="replace"
        )

    def native_inputs(self) -> list[TensorAttr]:
        return [
            tensors.tensor_attr(self._attr(abi.Query.NATIVE_INPUT_ATTR, i))
            for i in range(len(self._in_attrs))
        ]

    def native_outputs(self) -> list[TensorAttr]:
        return [
            tensors.tensor_attr(self._attr(abi.Query.NATIVE_OUTPUT_ATTR, i))
            for i in range(len(self._out_attrs))
        ]

    def memory(self) -> EvalMemoryResponse:
        info = abi.NATIVE.mem_size()
        ret = self._lib.rknn_query(
            self._ctx, int(abi.Query.MEM_SIZE), ctypes.byref(info), ctypes.sizeof(info)
        )
        if ret < 0:
            raise UnsupportedError(f"rknn_query(MEM_SIZE) failed: {abi.error_name(ret)}")
        weight, internal = int(info.total_weight_size), int(info.total_internal_size)
        other = max(int(info.total_dma_allocated_size) - weight - internal, 0)
        return EvalMemoryResponse(
            weight_memory=weight,
            internal_memory=internal,
            other_memory=other,
            model_size=self._path.stat().st_size,
            method=(
                f"rknn_query(MEM_SIZE): dma total {info.total_dma_allocated_size}, "
                f"sram total {info.total_sram_size}, sram free {info.free_sram_size}"
            ),
        )

    # --- running --------------------------------------------------------------------------------

    def run(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> list[np.ndarray]:
        """Run once; `formats` gives each input's layout (default NHWC) and pass_through."""
        return self._run(inputs, formats, None)

    def run_into(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        formats: Sequence[InputFormat] | None = None,
    ) -> list[np.ndarray]:
        """Run once, each output written into `outputs[i]` where it has the shape and type the
        runtime gives it: the general API fills it itself (rknn_outputs_get with is_prealloc: no
        buffer of the runtime's, no copy here); the zero-copy API's output is read in place from the
        runtime's memory and dequantized or laid out straight into it. Others come back as new arrays."""
        return self._run(inputs, formats, outputs)

    def _run(
        self,
        inputs: Sequence[np.ndarray],
        formats: Sequence[InputFormat] | None,
        into: Sequence[np.ndarray] | None,
    ) -> list[np.ndarray]:
        if len(inputs) != len(self._in_attrs):
            raise InputError(f"the model has {len(self._in_attrs)} inputs, got {len(inputs)}")
        fmts = list(formats) if formats is not None else [InputFormat()] * len(inputs)
        if len(fmts) != len(inputs):
            raise InputError(f"got {len(fmts)} input formats for {len(inputs)} inputs")
        if into is not None and len(into) != len(self._out_attrs):
            raise ExecutionError(f"{len(into)} output arrays for a model of {len(self._out_attrs)} outputs")
        if self._general:
            return self._run_general(inputs, fmts, into)
        return self._run_zero_copy(inputs, fmts, into)

    def _check(self, ret: int, what: str, error: Callable[[str], Exception] = ExecutionError) -> None:
        if ret < 0:
            raise error(f"{what} failed: {abi.error_name(ret)}")

    def _timed_run(self) -> None:
        start = time.perf_counter_ns()
        self._check(self._lib.rknn_run(self._ctx, None), "rknn_run")
        self._last_wall_us = (time.perf_counter_ns() - start) / 1000.0

    def input_shapes(self) -> list[InputShapes]:
        """The dims RKNN_QUERY_INPUT_ATTR gave and the shapes RKNN_QUERY_INPUT_DYNAMIC_RANGE lists."""
        return [
            InputShapes(tensors.attr_dims(attr), ranges)
            for attr, ranges in zip(self._in_attrs, self._ranges, strict=True)
        ]

    def set_input_shapes(
        self, shapes: Sequence[tuple[int, ...]]
    ) -> tuple[list[TensorAttr], list[TensorAttr]]:
        """rknn_set_input_shapes, then the runtime's current input and output attributes."""
        if not any(self._ranges):
            raise InputError("this model has static input shapes; only a dynamic-shape model takes others")
        if len(shapes) != len(self._in_attrs):
            raise InputError(f"{len(shapes)} input shapes for a model of {len(self._in_attrs)} inputs")
        self._set_shapes([tuple(int(d) for d in shape) for shape in shapes])
        current = [self._attr(abi.Query.CURRENT_INPUT_ATTR, i) for i in range(len(self._in_attrs))]
        return (
            [tensors.tensor_attr(attr, is_input=True) for attr in current],
            [tensors.tensor_attr(attr) for attr in self._out_attrs],
        )

    def _apply_shapes(self, inputs: Sequence[np.ndarray], fmts: Sequence[InputFormat]) -> None:
        """Switch a dynamic-shape model to the inputs' shapes when they changed."""
        if any(self._ranges):
            self._set_shapes(
                [tensors.runtime_shape(array, fmt) for array, fmt in zip(inputs, fmts, strict=True)]
            )

    def _set_shapes(self, shapes: list[tuple[int, ...]]) -> None:
        """rknn_set_input_shapes with each input's attribute at its new shape, unless none changed."""
        if shapes == self._current_shapes:
            return
        attrs = (abi.NATIVE.tensor_attr * len(shapes))()
        for i, shape in enumerate(shapes):
            ctypes.memmove(ctypes.byref(attrs[i]), ctypes.byref(self._in_attrs[i]), ctypes.sizeof(attrs[i]))
            attrs[i].n_dims = len(shape)
            attrs[i].dims[: len(shape)] = shape
            attrs[i].fmt = abi.TensorFormat.NHWC if len(shape) == 4 else abi.TensorFormat.UNDEFINED
        ret = self._lib.rknn_set_input_shapes(self._ctx, len(shapes), attrs)
        if ret < 0:
            allowed = "; ".join(f"input {i}: {list(r)}" for i, r in enumerate(self._ranges) if r)
            raise InputError(f"input shapes {shapes} are not among the model's shapes ({allowed})")
        self._current_shapes = list(shapes)
        self._out_attrs = [self._attr(abi.Query.CURRENT_OUTPUT_ATTR, i) for i in range(len(self._out_attrs))]

    def _input_format(self, index: int, data: np.ndarray, fmt: InputFormat) -> int:
        """pass_through data is in the model's own layout; other 4-D data says NCHW or NHWC."""
        if fmt.pass_through:
            return int(self._in_attrs[index].fmt)
        if data.ndim == 4:
            return int(abi.TensorFormat.NCHW if fmt.layout.upper() == "NCHW" else abi.TensorFormat.NHWC)
        return int(abi.TensorFormat.UNDEFINED)

    def _run_general(
        self,
        inputs: Sequence[np.ndarray],
        fmts: Sequence[InputFormat],
        into: Sequence[np.ndarray] | None,
    ) -> list[np.ndarray]:
        self._apply_shapes(inputs, fmts)
        buffers = []
        rknn_inputs = (abi.NATIVE.input * len(inputs))()
        for i, (array, fmt) in enumerate(zip(inputs, fmts, strict=True)):
            data, kind = tensors.runtime_type(np.asarray(array))
            buffers.append(data)
            entry = rknn_inputs[i]
            entry.index = i
            entry.buf = data.ctypes.data
            entry.size = data.nbytes
            entry.pass_through = int(fmt.pass_through)
            entry.type = int(kind)
            entry.fmt = self._input_format(i, data, fmt)
        self._check(
            self._lib.rknn_inputs_set(self._ctx, len(inputs), rknn_inputs), "rknn_inputs_set", InputError
        )
        self._timed_run()
        outputs = (abi.NATIVE.output * len(self._out_attrs))()
        raw = [tensors.travels_quantized(attr) for attr in self._out_attrs]
        kinds = [
            (tensors.numpy_dtype(attr.type) if is_raw else np.dtype(np.float32), tensors.attr_dims(attr))
            for attr, is_raw in zip(self._out_attrs, raw, strict=True)
        ]
        targets = [_target(into, i, kind) for i, kind in enumerate(kinds)]
        for i, target in enumerate(targets):
            outputs[i].index = i
            outputs[i].want_float = int(not raw[i])
            if target is not None:  # the runtime writes it there itself
                outputs[i].is_prealloc = 1
                outputs[i].buf = target.ctypes.data
                outputs[i].size = target.nbytes
        self._check(
            self._lib.rknn_outputs_get(self._ctx, len(self._out_attrs), outputs, None), "rknn_outputs_get"
        )
        try:
            return [
                target
                if target is not None
                else np.frombuffer(ctypes.string_at(out.buf, out.size), dtype=dtype).reshape(dims)
                for out, target, (dtype, dims) in zip(outputs, targets, kinds, strict=True)
            ]
        finally:
            self._lib.rknn_outputs_release(self._ctx, len(self._out_attrs), outputs)

    def _bind_io(self) -> None:
        """Zero-copy: one runtime buffer per input and output in the native layout, bound once."""
        self._native_in = [self._attr(abi.Query.NATIVE_INPUT_ATTR, i) for i in range(len(self._in_attrs))]
        self._native_out = [self._attr(abi.Query.NATIVE_OUTPUT_ATTR, i) for i in range(len(self._out_attrs))]
        self._native_in_attrs = [tensors.tensor_attr(attr) for attr in self._native_in]
        self._native_out_attrs = [tensors.tensor_attr(attr) for attr in self._native_out]
        self._in_mems = [self._create_mem(attr) for attr in self._native_in]
        self._out_mems = [self._create_mem(attr) for attr in self._native_out]
        for mem, attr in zip(self._in_mems + self._out_mems, self._native_in + self._native_out, strict=True):
            self._check(self._lib.rknn_set_io_mem(self._ctx, mem, ctypes.byref(attr)), "rknn_set_io_mem")
        self._io_bound = True

    def _create_mem(self, attr: ctypes.Structure) -> int:
        size = max(int(attr.size_with_stride), int(attr.size))
        mem = self._lib.rknn_create_mem(self._ctx, size)
        if not mem:
            raise ExecutionError(f"rknn_create_mem({size}) failed")
        self._mems.append(mem)
        return int(mem)

    def _mem_view(self, mem: int) -> ctypes.Structure:
        return abi.NATIVE.tensor_mem.from_address(mem)

    def _native_input(
        self, array: np.ndarray, fmt: InputFormat, attr: ctypes.Structure, spec: TensorAttr
    ) -> np.ndarray:
        if fmt.pass_through:
            return np.ascontiguousarray(array)
        data = quantize(tensors.to_nhwc(np.asarray(array), fmt), spec)
        dims = tensors.attr_dims(attr)
        stride = int(attr.w_stride)
        if attr.fmt == abi.TensorFormat.NHWC and len(dims) == 4 and stride > dims[2]:
            data = np.pad(data, ((0, 0), (0, 0), (0, stride - dims[2]), (0, 0)))
        return np.ascontiguousarray(data)

    def _run_zero_copy(
        self,
        inputs: Sequence[np.ndarray],
        fmts: Sequence[InputFormat],
        into: Sequence[np.ndarray] | None,
    ) -> list[np.ndarray]:
        if not self._io_bound:
            self._bind_io()
        for mem, array, fmt, attr, spec in zip(
            self._in_mems, inputs, fmts, self._native_in, self._native_in_attrs, strict=True
        ):
            data = self._native_input(array, fmt, attr, spec)
            view = self._mem_view(mem)
            if data.nbytes > view.size:
                raise InputError(
                    f"input {attr.name.decode()} has {data.nbytes} bytes; the runtime expects {view.size}"
                )
            ctypes.memmove(view.virt_addr, data.ctypes.data, data.nbytes)
        self._timed_run()
        results = []
        for i, (mem, native, spec, model) in enumerate(
            zip(self._out_mems, self._native_out, self._native_out_attrs, self._out_attrs, strict=True)
        ):
            view = self._mem_view(mem)
            dtype = tensors.numpy_dtype(native.type)
            count = int(native.n_elems)
            # The runtime's memory, read in place (the next run writes over it: copied before return).
            stored = (ctypes.c_char * (count * dtype.itemsize)).from_address(view.virt_addr)
            raw = np.frombuffer(memoryview(stored), dtype=dtype)
            # As the runtime's want_float gives outputs: real values, float32.
            real = tensors.native_to_model_layout(
                dequantize(raw, spec).astype(np.float32, copy=False), native, model
            )
            target = _target(into, i, (real.dtype, real.shape))
            if target is not None:
                np.copyto(target, real)
                results.append(target)
            else:
                results.append(real.copy() if np.may_share_memory(real, raw) else real)
        return results

    def _default_inputs(self) -> list[np.ndarray]:
        arrays = []
        for spec, ranges in zip(self.inputs, self._ranges, strict=True):
            shape = ranges[0] if ranges else spec.shape
            arrays.append(np.zeros(shape, dtype=np.float32))
        return arrays

    def perf(self, inputs: Sequence[np.ndarray] | None) -> EvalPerfResponse:
        self.run(inputs if inputs is not None else self._default_inputs())
        if not self._general:
            return EvalPerfResponse(
                layers=(),
                total_time_us=self._last_wall_us,
                raw_text=NO_LAYER_PERF_NOTE.format(kind=self._library.kind),
            )
        info = abi.NATIVE.perf_run()
        ret = self._lib.rknn_query(
            self._ctx, int(abi.Query.PERF_RUN), ctypes.byref(info), ctypes.sizeof(info)
        )
        total = float(info.run_duration) if ret >= 0 else self._last_wall_us
        note = "" if ret >= 0 else PERF_RUN_MISSING_NOTE
        if not self._options.perf_debug:
            return EvalPerfResponse(layers=(), total_time_us=total, raw_text=note)
        detail = self._query(abi.Query.PERF_DETAIL, abi.NATIVE.perf_detail())
        text = (
            ctypes.string_at(detail.perf_data, detail.data_len).decode(errors="replace")
            if detail.perf_data
            else ""
        )
        table = parse_perf_detail(text)
        return EvalPerfResponse(
            layers=table.layers,
            total_time_us=total,
            total_rw_kb=table.rw_kb,
            raw_text=text,
            extra_columns=table.extra_columns,
        )

    def dump_layers(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> Iterator[LayerDump]:
        """Run once in a child process whose runtime dumps every layer, and yield the tensors."""
        return capture_layers(
            library=self._library.path,
            model=self._path,
            options=self._options,
            soc=self._probe.soc,
            plugin_dir=self._plugin_dir,
            inputs=inputs,
            formats=formats,
        )

    def close(self) -> None:
        if self._ctx is None:
            return
        for mem in self._mems:
            self._lib.rknn_destroy_mem(self._ctx, mem)
        self._mems.clear()
        with self._family:
            self._lib.rknn_destroy(self._ctx)
            self._ctx = None


def _target(
    into: Sequence[np.ndarray] | None, index: int, kind: tuple[np.dtype, Sequence[int]]
) -> np.ndarray | None:
    """`into[index]` when the runtime's output (of this dtype and shape) can be written into it as
    it is: writable, C-contiguous, of that very dtype and shape."""
    if into is None:
        return None
    target = into[index]
    dtype, shape = kind
    if target.dtype != dtype or tuple(target.shape) != tuple(shape):
        return None
    if not (target.flags.c_contiguous and target.flags.writeable):
        return None
    return target
