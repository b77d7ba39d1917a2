"""The backend interface: what the daemon needs from a runtime, in plain Python over numpy arrays.

A backend opens a model file (by path, never by bytes: models can be several GiB) into a
`ModelRuntime`, which describes its tensors and runs, profiles, measures and dumps it. Nothing here
knows about gRPC; the service maps these calls and `BackendError` subclasses onto the wire.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse, FrequencyList, LayerDump, TensorAttr


class BackendError(Exception):
    """Base of errors a backend raises; the message is shown to the user as is."""


class ModelFormatError(BackendError):
    """The file is not a model this backend can load (wrong format, corrupt, unsupported ops)."""


class InputError(BackendError):
    """Inputs that do not fit the model (count, shape, dtype)."""


class UnsupportedError(BackendError):
    """The backend or the board cannot do what was asked (e.g. a core mask the SoC lacks)."""


class ExecutionError(BackendError):
    """The runtime failed while running a valid request."""


class OverBudget(BackendError):
    """A model or run that needs more memory than its session's budget."""


class WorkerLost(ExecutionError):
    """The process running a session's model was killed (call deadline) or died: the session is broken."""


@dataclass(frozen=True)
class InputFormat:
    """How the caller's data for one input is laid out (the toolkit's data_format / pass_through)."""

    layout: str = "NHWC"  # applies to 4-D inputs only
    pass_through: bool = False


@dataclass(frozen=True)
class InputShapes:
    """The shapes one input takes, as its runtime declares them (librknnrt's RKNN_QUERY_INPUT_ATTR and
    RKNN_QUERY_INPUT_DYNAMIC_RANGE): a `TensorAttr` marks a dynamic dimension -1, while a protocol that
    describes tensors by their runtime's attributes (the toolkit's) needs the dims the runtime gives
    and the list of shapes. Every shape is in the input's layout (its `TensorAttr.layout`)."""

    # The dims the runtime's input attribute gives (for a dynamic input, one of its shapes) ...
    declared: tuple[int, ...]
    # ... and every shape a dynamic input takes (() for a static input).
    ranges: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class RuntimeOptions:
    """Options of `init_runtime` that reach the runtime."""

    target: str = ""
    perf_debug: bool = False
    eval_mem: bool = False
    core_mask: int = 0
    fallback_prior_device: str = "cpu"
    # The session's memory budget (--max-session-memory; 0: none): what its model may materialize.
    max_memory_bytes: int = 0


@dataclass
class FrequencyOutcome:
    """What a measurement ran at: whether frequencies were fixed, why not, and the readings."""

    fixed: bool = False
    note: str = ""
    frequencies: tuple[FrequencyList, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class VersionInfo:
    api: str  # e.g. "onnxruntime 1.18.0" or "2.3.2 (429f97ae6b@2025-04-09T09:08:16)"
    driver: str  # NPU driver / runtime library version string


class ModelRuntime(abc.ABC):
    """A model loaded into a runtime. Not thread-safe: the daemon serialises calls per session."""

    inputs: Sequence[TensorAttr]
    outputs: Sequence[TensorAttr]
    # Whether every run does the same work whatever the inputs' values (static shapes throughout, no
    # shape computed from the data): then a run that was quick stays quick.
    steady: bool = False

    @abc.abstractmethod
    def run(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> list[np.ndarray]:
        """Run once. Inputs are already checked against `inputs` (count, dtype, shape); `formats`
        (default: every input in its spec's layout, converted) matters to runtimes that convert."""

    def run_into(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        formats: Sequence[InputFormat] | None = None,
    ) -> list[np.ndarray]:
        """Run once, writing each output into `outputs[i]` (a writable C-contiguous array of that
        output's dtype and static shape, e.g. memory shared with the client) where the runtime can.
        Returns the outputs: `outputs[i]` itself for each one written there, else the runtime's own
        array (the caller copies it). By default nothing is written in place: this is `run`."""
        return self.run(inputs, formats)

    def bind(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        formats: Sequence[InputFormat] | None = None,
    ) -> Callable[[], list[np.ndarray]]:
        """`run_into` of these very arrays, repeatable: each call reads the inputs' memory afresh
        and answers as `run_into` does. For frames that reuse their memory (a doorbell's, in shared
        memory), so that a runtime that can prepares the run once; by default each call is run_into."""
        return functools.partial(self.run_into, inputs, outputs, formats)

    @abc.abstractmethod
    def perf(self, inputs: Sequence[np.ndarray] | None) -> EvalPerfResponse:
        """Time the model; per-layer rows only when opened with perf_debug."""

    @abc.abstractmethod
    def memory(self) -> EvalMemoryResponse:
        """Memory the runtime holds for this model."""

    def dump_layers(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> Iterator[LayerDump]:
        """Run once and yield every intermediate tensor, one at a time."""
        raise UnsupportedError("this runtime cannot dump per-layer tensors")

    def sdk_version(self) -> VersionInfo | None:
        """Versions the runtime reports for this model, when it differs from the backend's own."""
        return None

    def input_shapes(self) -> list[InputShapes]:
        """Each input's declared dims and, for a dynamic-shape input, the shapes it takes; by default
        each input's own shape and no ranges."""
        return [InputShapes(tuple(spec.shape)) for spec in self.inputs]

    def set_input_shapes(
        self, shapes: Sequence[tuple[int, ...]]
    ) -> tuple[list[TensorAttr], list[TensorAttr]]:
        """Switch a dynamic-shape model to these input shapes (one per input, each in its input's
        layout and among its `input_shapes().ranges`) for the runs that follow; returns the inputs' and
        outputs' descriptions at those shapes. A shape the model does not take is an InputError."""
        raise UnsupportedError("this runtime cannot change a model's input shapes")

    @abc.abstractmethod
    def close(self) -> None:
        """Free everything the runtime holds for this model. Safe to call twice."""


@dataclass(frozen=True)
class BackendCapabilities:
    perf_per_layer: bool = False
    memory_detail: bool = False
    layer_dumps: bool = False
    core_mask: bool = False
    dynamic_shape: bool = False
    fix_freq: bool = False


class Backend(abc.ABC):
    """A kind of runtime (ONNX Runtime on the CPU, librknnrt on the NPU)."""

    name: str
    model_suffixes: tuple[str, ...]
    capabilities: BackendCapabilities
    # Why `measuring` leaves frequencies alone, for backends that cannot pin them.
    unpinned_reason = "this runtime cannot pin them"
    # How many runs of one model compute at once to good effect: what one caller's sessions of a
    # model in flight together gain from (more only queue).
    parallel_runs = 1
    # Whether the backend lets no more than `parallel_runs` runs compute at once (a gate its runs
    # wait on): the data plane then runs them on that many threads of their own (DataPlane.runs).
    gated_runs = False
    # Whether the sessions of one model file share its one loaded copy while any of them is open:
    # the model repository then keeps a session of each READY model open, so that callers' sessions
    # find it loaded (kserve/models.py) rather than each first one after a quiet spell loading it again.
    shares_models = False

    @abc.abstractmethod
    def version(self) -> VersionInfo: ...

    @abc.abstractmethod
    def open(self, model_path: Path, options: RuntimeOptions) -> ModelRuntime:
        """Load a model by path (other files of the model sit beside it)."""

    def soc(self) -> str:
        """The SoC this backend serves, or "" when it stands in for any."""
        return ""

    def frequencies(self) -> tuple[FrequencyList, ...]:
        return ()

    @contextmanager
    def measuring(self, fix_freq: bool) -> Iterator[FrequencyOutcome]:
        """Frame a performance measurement; backends that can pin frequencies do so when asked."""
        note = f"frequencies were not fixed: {self.unpinned_reason}" if fix_freq else ""
        yield FrequencyOutcome(fixed=False, note=note, frequencies=self.frequencies())
