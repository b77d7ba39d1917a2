"""The host runtime's models: an ONNX model loaded into ONNX Runtime (see host.HostBackend).

Per-layer timings come from ONNX Runtime's own profiler (real per-node durations of warmed-up runs;
with perf_debug the total is those same runs', as the toolkit's is), memory from the model's weights,
a liveness pass over intermediates and the process's measured memory growth while loading.

Apart from host.py because onnxruntime costs a small board a tenth of a second to import: the
daemon imports this module when it opens its first model, not when it starts. The onnx package,
as costly, is imported only to study a model not studied before (host_study, host_facts) and for
a dump.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import psutil

from rknn_proto.buffers import MIN_POOLED_BYTES, BufferPool
from rknn_proto.messages import (
    EvalMemoryResponse,
    EvalPerfResponse,
    LayerDump,
    LayerPerf,
    QuantType,
    TensorAttr,
)
from rknn_server.runtime import host_facts
from rknn_server.runtime.base import (
    ExecutionError,
    InputFormat,
    ModelFormatError,
    ModelRuntime,
    OverBudget,
    RuntimeOptions,
)
from rknn_server.runtime.redact import without_paths

if TYPE_CHECKING:
    import onnx

    from rknn_server.runtime import onnx_graph
    from rknn_server.runtime.qdq_outputs import Affine

log = logging.getLogger(__name__)

# ONNX Runtime's type strings for the element types that travel on the wire.
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32,
    "tensor(uint32)": np.uint32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}
# Profiler element-type names -> the toolkit's DataType column.
_PROFILE_TYPES = {
    "float": "FLOAT32",
    "float16": "FLOAT16",
    "double": "FLOAT64",
    "int8": "INT8",
    "uint8": "UINT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "bool": "BOOL",
}
PERF_RUNS = 5
PROFILE_RUNS = 3
# Most bytes of layer outputs one dump run exposes: the daemon never holds more than this many at once.
DUMP_BATCH_BYTES = 32 << 20


def session_options(threads: int, model_dir: Path | None = None, arena: bool = True) -> ort.SessionOptions:
    """The options every host session uses; benchmarks build their baseline with the same.

    With `model_dir`, external data resolves there even when the model is loaded from bytes (a
    rewritten graph), never against the working directory."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # Idle worker threads must not spin: on a small board (or a 2-core PC) spinning threads of one
    # session steal the cores another session, or the daemon's own I/O, needs.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if model_dir is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_dir))
    # `arena`: a memory arena per model, shared by the runs of all its sessions. Without one, glibc
    # keeps what interleaved runs freed (MobileNetV2, 8 callers: daemon RSS 313-467 MiB without, 180
    # with; the same latency). But an arena keeps its peak, outputs included, for the model's life: a
    # model whose run memory the caller's input decides runs without (LoadedModel).
    opts.enable_cpu_mem_arena = arena
    return opts


def dump_session_options(threads: int, model_dir: Path) -> ort.SessionOptions:
    """Options for the runs behind a per-layer dump.

    No graph optimisation: every exposed tensor is its own node's output computed as the graph says,
    the same in every batch (fusions would change with the set of exposed outputs). No memory arena:
    what a batch allocated goes back when its session ends. External weights are found beside the model.
    """
    opts = session_options(threads, model_dir, arena=False)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return opts


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim where the C library has it (not on musl or macOS)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps large freed blocks in its per-thread arenas,
    so without this each dump batch (run from whichever executor thread) would add to the RSS."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def runtime_failure(what: str, exc: Exception) -> str:
    """`what` with ONNX Runtime's reason, for the client: the raw text (which names server paths) goes
    to the log only."""
    log.warning("%s: %s", what, exc)
    return f"{what}: {without_paths(str(exc))}"


def _spec(index: int, arg: ort.NodeArg, affine: Affine | None = None) -> TensorAttr:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise ModelFormatError(f"tensor {arg.name!r} has type {arg.type}, which the wire cannot carry")
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    layout = "NCHW" if len(shape) == 4 else "UNDEFINED"
    attr = TensorAttr(index, arg.name, shape, np.dtype(dtype), layout)
    if affine is None:
        return attr
    zero_point, scale = affine
    return replace(attr, quant_type=QuantType.AFFINE_ASYMMETRIC, zero_point=zero_point, scale=scale)


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def _type_shapes(entries: list[dict[str, list[int]]]) -> list[tuple[str, list[int]]]:
    return [(k, v) for entry in entries for k, v in entry.items()]


def parse_profile(events: list[dict], runs: int) -> list[LayerPerf]:
    """Per-node rows from ONNX Runtime profiler events: order of first run, mean time over `runs`."""
    order: list[str] = []
    durations: dict[str, list[float]] = {}
    first: dict[str, dict] = {}
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        node = event["name"][: -len("_kernel_time")]
        if node not in durations:
            order.append(node)
            durations[node] = []
            first[node] = event["args"]
        durations[node].append(float(event["dur"]))
    rows = []
    for index, node in enumerate(order, start=1):
        args = first[node]
        inputs = _type_shapes(args.get("input_type_shape", []))
        outputs = _type_shapes(args.get("output_type_shape", []))
        elem = outputs[0][0] if outputs else (inputs[0][0] if inputs else "float")
        samples = durations[node][-runs:]
        rows.append(
            LayerPerf(
                index=index,
                op_type=str(args.get("op_name", "")),
                data_type=_PROFILE_TYPES.get(elem, elem.upper()),
                target="CPU",
                input_shapes=tuple(_shape_text(s) for _, s in inputs),
                output_shape=_shape_text(outputs[0][1]) if outputs else "\\",
                time_us=statistics.fmean(samples),
                name=f"{args.get('op_name', '')}:{node}",
                extra={"Provider": str(args.get("provider", "")).removesuffix("ExecutionProvider")},
            )
        )
    return rows


def profiled_run_us(events: list[dict], runs: int) -> float:
    """Mean duration of the last `runs` whole runs in ONNX Runtime profiler events (its `model_run`
    spans, which hold the node spans parse_profile reads)."""
    spans = [float(e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    return statistics.fmean(spans[-runs:]) if spans else 0.0


class LoadedModel:
    """One model file in ONNX Runtime: its InferenceSession, facts and tensor descriptions, shared by
    every session of that file (ONNX Runtime runs one InferenceSession from several threads at once),
    so that eight callers of a model hold it once. Made and found by host.ModelShelf."""

    def __init__(self, path: Path, threads: int, budget: int, remember: bool = False) -> None:
        """`remember`: the path is in the daemon's cache, where the model's facts are kept beside it
        (host_facts), so that a model studied once is not studied again, nor onnx imported for it."""
        self.path = path
        self.threads = threads
        quantized: dict[str, Affine] = {}
        self.source: str | bytes  # what ONNX Runtime loads (a profile's session too)
        facts = host_facts.recall(path) if remember else None
        if facts is not None:  # studied before: a file ONNX Runtime loads as it is
            self.facts, self.source = facts, str(path)
            self.check_budget(budget)
            rss_before = psutil.Process().memory_info().rss
        else:
            from rknn_server.runtime import host_study

            try:
                graph, virtual = host_study.read_model(path)
            except Exception as exc:
                raise ModelFormatError(
                    runtime_failure(f"{path.name} is not a loadable ONNX model", exc)
                ) from exc
            self.facts = host_study.facts_of(graph, path.parent)
            self.check_budget(budget)
            rss_before = psutil.Process().memory_info().rss
            self.source, quantized = host_study.runnable(None if virtual else path, graph)
            del graph  # ONNX Runtime holds the weights now; graph() reads them again for a dump
            if remember and self.source == str(path):  # a rewrite is made again at each load
                host_facts.remember(path, self.facts)
        try:
            # An arena only for a steady model: one input that made a run huge must leave nothing held.
            self.session = ort.InferenceSession(
                self.source,
                session_options(threads, path.parent, self.facts.steady),
                providers=["CPUExecutionProvider"],
            )
        except Exception as exc:
            raise ModelFormatError(runtime_failure(f"ONNX Runtime cannot load {path.name}", exc)) from exc
        self.load_growth = max(0, psutil.Process().memory_info().rss - rss_before)
        self.inputs = [_spec(i, a) for i, a in enumerate(self.session.get_inputs())]
        self.outputs = [_spec(i, a, quantized.get(a.name)) for i, a in enumerate(self.session.get_outputs())]
        self.input_names = [s.name for s in self.inputs]

    def graph(self) -> onnx.ModelProto:
        """The model's graph, weights and all, read again from its file (the cache's, which does not
        change): only a dump needs it, so a loaded model keeps its weights once, in ONNX Runtime."""
        from rknn_server.runtime import host_study

        return host_study.read_model(self.path)[0]

    def check_budget(self, budget: int) -> None:
        """Refuse, before ONNX Runtime allocates anything, a session whose budget the model exceeds."""
        if budget and self.facts.need > budget:
            raise OverBudget(
                f"{self.path.name} needs at least {self.facts.need} bytes to load and run (weights, constants "
                "computed at load, live intermediates), over the session budget "
                f"max_session_memory={budget} (--max-session-memory)"
            )


class HostModel(ModelRuntime):
    """One session's view of a shared `LoadedModel`: its own options and output buffers."""

    def __init__(
        self, model: LoadedModel, options: RuntimeOptions, gate: AbstractContextManager[Any]
    ) -> None:
        self._model = model
        self._options = options
        self._gate = gate
        self.inputs = model.inputs
        self.outputs = model.outputs
        self.steady = model.facts.steady
        self._input_names = model.input_names
        # Outputs of static shapes are written into arrays allocated here (see run) where one of them is
        # large enough for the pool to hand its memory out again; off for good once ONNX Runtime refuses
        # one (a model whose declared shape is not what it computes). Small outputs gain nothing from the
        # pool (it hands out new memory below MIN_POOLED_BYTES), and binding them costs more than ONNX
        # Runtime's own allocation: 34 us a run of a 1x4 identity here, against 16 us without.
        self._outputs_in_place = not any(s.is_dynamic for s in self.outputs) and any(
            s.size_bytes >= MIN_POOLED_BYTES for s in self.outputs
        )
        self._output_buffers = BufferPool()

    def run(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> list[np.ndarray]:
        """The service hands inputs over in the model's layout and dtype already, so formats change nothing.

        Static outputs go into buffers of the model's own (rknn_proto.buffers), used again once the
        arrays of an earlier run are freed: ONNX Runtime's own, with no memory arena, are fresh pages
        every run, faulted in 4 KiB at a time (measured here on a 64 MiB identity: 40 ms of CPU a
        run, 14 ms into np.empty, 6.5 ms into memory used before)."""
        if not self._outputs_in_place:
            return self._run(self._model.session, inputs)
        targets = [
            self._output_buffers.take(spec.size_bytes).view(spec.dtype).reshape(spec.shape)
            for spec in self.outputs
        ]
        outputs = self.run_into(inputs, targets, formats)
        self._outputs_in_place = all(o is t for o, t in zip(outputs, targets, strict=True))
        return outputs

    def run_into(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        formats: Sequence[InputFormat] | None = None,
    ) -> list[np.ndarray]:
        """ONNX Runtime reads the inputs and writes the outputs where they are (IOBinding over
        OrtValues that wrap the arrays' memory): no copy either way, no output allocated."""
        return self.bind(inputs, outputs, formats)()

    def bind(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        formats: Sequence[InputFormat] | None = None,
    ) -> Callable[[], list[np.ndarray]]:
        """One IOBinding over the arrays, run on each call: building it costs more than a small
        model's run takes from Python (~60 us here), so a doorbell's frames build it once."""
        arrays = [np.ascontiguousarray(a) for a in inputs]
        targets = list(outputs)
        try:
            binding = self._model.session.io_binding()
            # Each OrtValue only points at its array's memory; `arrays` and `targets` outlive it.
            for name, array in zip(self._input_names, arrays, strict=True):
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
            for spec, target in zip(self.outputs, targets, strict=True):
                binding.bind_ortvalue_output(spec.name, ort.OrtValue.ortvalue_from_numpy(target))
        except Exception as exc:
            log.debug("outputs not written in place: %s", exc)
            return functools.partial(self._run, self._model.session, arrays)

        refused = False  # once ONNX Runtime refuses the binding, every later call runs as `run` does

        def run() -> list[np.ndarray]:
            nonlocal refused
            if not refused:
                try:
                    with self._gate:
                        self._model.session.run_with_iobinding(binding)
                    return list(targets)
                except Exception as exc:
                    # E.g. an output whose computed shape is not the one the model declares: ONNX Runtime
                    # refuses the given array before writing it. Run as `run` does (a real failure fails again).
                    log.debug("outputs not written in place: %s", exc)
                    refused = True
            return self._run(self._model.session, arrays)

        return run

    def _run(self, session: ort.InferenceSession, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            with self._gate:
                return list(session.run(None, dict(zip(self._input_names, inputs, strict=True))))
        except Exception as exc:
            raise ExecutionError(runtime_failure("ONNX Runtime failed to run the model", exc)) from exc

    def sample_inputs(self) -> list[np.ndarray]:
        """Zeros of each input's shape (dynamic dimensions as 1), for timing without user data."""
        return [np.zeros([max(d, 1) for d in s.shape], dtype=s.dtype) for s in self.inputs]

    def perf(self, inputs: Sequence[np.ndarray] | None) -> EvalPerfResponse:
        """Without perf_debug, the median of timed runs; with it, the per-layer times and the total of
        the same profiled runs, so the table adds up under the total it is printed with (the rest is
        ONNX Runtime's own work between nodes), as one perf run gives both on a board."""
        feed = list(inputs) if inputs is not None else self.sample_inputs()
        if self._options.perf_debug:
            layers, total = self._profile(feed)
            return EvalPerfResponse(layers=tuple(layers), total_time_us=total, extra_columns=("Provider",))
        self._run(self._model.session, feed)
        times = []
        for _ in range(PERF_RUNS):
            start = time.perf_counter()
            self._run(self._model.session, feed)
            times.append((time.perf_counter() - start) * 1e6)
        return EvalPerfResponse(layers=(), total_time_us=statistics.median(times))

    def _profile(self, feed: Sequence[np.ndarray]) -> tuple[list[LayerPerf], float]:
        """Per-layer rows and the mean run time of PROFILE_RUNS profiled runs after one warm-up run."""
        with tempfile.TemporaryDirectory(prefix="rknn-profile-") as tmp:
            opts = session_options(self._model.threads, self._model.path.parent)
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tmp) / "profile")
            try:
                session = ort.InferenceSession(self._model.source, opts, providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise ExecutionError(runtime_failure("ONNX Runtime cannot profile the model", exc)) from exc
            for _ in range(PROFILE_RUNS + 1):
                self._run(session, feed)
            profile = Path(session.end_profiling())
            events = json.loads(profile.read_text())
        return parse_profile(events, PROFILE_RUNS), profiled_run_us(events, PROFILE_RUNS)

    def memory(self) -> EvalMemoryResponse:
        weights, internal = self._model.facts.weight_bytes, self._model.facts.internal_bytes
        model_size = sum(
            p.stat().st_size
            for p in self._model.path.parent.iterdir()
            if p.is_file() and not p.name.startswith(".")
        )
        return EvalMemoryResponse(
            weight_memory=weights,
            internal_memory=internal,
            other_memory=max(0, self._model.load_growth - weights),
            model_size=model_size,
            method="weights: ONNX initializers; internal: peak of live intermediate tensors; "
            "other: process memory growth while loading, less the weights",
        )

    def dump_layers(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> Iterator[LayerDump]:
        """Every layer's tensor, inputs first, computed in batches of at most DUMP_BATCH_BYTES.

        Each batch is one run of the part of the graph that computes its tensors, exposed as outputs;
        a batch's tensors are handed out (and dropped) before the next batch is computed.
        """
        from rknn_server.runtime import host_study, onnx_graph

        feeds = dict(zip(self._input_names, inputs, strict=True))
        sendable = host_study.dump_elem_types(list(_ORT_TYPES.values()))
        graph = self._model.graph()
        onnx_graph.fix_input_shapes(graph, {n: tuple(a.shape) for n, a in feeds.items()})
        tensors = onnx_graph.inferred_tensors(graph)
        layers = [
            layer for layer in onnx_graph.dump_tensors(graph, tensors) if layer.info.elem_type in sendable
        ]
        for layer in layers:
            if layer.info.name in feeds:
                yield LayerDump(
                    layer.index, layer.op_type, layer.node_name, layer.info.name, feeds[layer.info.name]
                )
        computed = [layer for layer in layers if layer.info.name not in feeds]
        for batch in onnx_graph.dump_batches(computed, DUMP_BATCH_BYTES):
            names = [layer.info.name for layer in batch]
            release_free_memory()
            values = dict(zip(names, self._run_batch(graph, names, tensors, feeds), strict=True))
            release_free_memory()
            for layer in batch:
                array = values.pop(layer.info.name).numpy()
                yield LayerDump(layer.index, layer.op_type, layer.node_name, layer.info.name, array)

    def _run_batch(
        self,
        graph: onnx.ModelProto,
        names: list[str],
        tensors: dict[str, onnx_graph.ValueInfo],
        feeds: dict[str, np.ndarray],
    ) -> list[ort.OrtValue]:
        """The batch's tensors as ONNX Runtime holds them: each becomes numpy (a copy) only when sent."""
        from rknn_server.runtime import onnx_graph

        model = onnx_graph.model_for_outputs(graph, names, tensors)
        opts = dump_session_options(self._model.threads, self._model.path.parent)
        try:
            session = ort.InferenceSession(
                model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise ExecutionError(
                runtime_failure("ONNX Runtime cannot expose the model's layers", exc)
            ) from exc
        del model
        try:
            ort_feeds = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
            return list(session.run_with_ort_values(names, ort_feeds))
        except Exception as exc:
            raise ExecutionError(runtime_failure("ONNX Runtime failed while dumping layers", exc)) from exc

    def close(self) -> None:
        """Let go of the shared model: the last session's close frees it."""
        self.__dict__.pop("_model", None)
