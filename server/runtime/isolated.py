"""Run a session's model in a child process, so a hung or crashing native call can be killed
without taking the daemon (or other sessions) down.

The child is started with the spawn method (never fork after gRPC exists), builds the backend
from a picklable factory, opens the model, then serves calls over a pipe one at a time.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import multiprocessing.connection
import resource
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rknn_proto.messages import EvalMemoryResponse, EvalPerfResponse, FrequencyList, LayerDump, TensorAttr
from rknn_server.runtime.base import (
    Backend,
    BackendError,
    ExecutionError,
    FrequencyOutcome,
    InputFormat,
    InputShapes,
    ModelRuntime,
    OverBudget,
    RuntimeOptions,
    VersionInfo,
    WorkerLost,
)

BackendFactory = Callable[[], Backend]
_END = "__end__"
# How long a worker gets to free its model when asked to close, before it is killed.
_CLOSE_GRACE_S = 5.0
# Loading starts a Python process and a runtime: it gets at least this long, whatever --call-timeout says.
_OPEN_TIMEOUT_S = 120.0


# glibc's mallopt parameter for the number of malloc arenas: each reserves 64 MiB of address space.
_M_ARENA_MAX = -8
# What an allocation that hit the address-space limit says (numpy: MemoryError; ONNX Runtime: these).
_ALLOCATION_FAILURES = ("bad_alloc", "allocate memory", "Cannot allocate")


def _address_space() -> int:
    """Bytes of address space this process maps now (VmSize)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _limit_memory(budget: int) -> None:
    """Cap the worker's address space at what it maps now (Python, the runtime's libraries) plus the
    session's budget, so a model or run that would need more fails in the worker, not the machine.
    Few malloc arenas: each thread's reserved-but-unused arena would count against the cap."""
    if budget <= 0:
        return
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, 2)
    cap = _address_space() + budget
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _serve(
    conn: multiprocessing.connection.Connection, factory: BackendFactory, path: Path, options: RuntimeOptions
) -> None:
    def portable(exc: BaseException) -> BackendError:
        return _portable(exc, options.max_memory_bytes)

    try:
        backend = factory()
        _limit_memory(options.max_memory_bytes)
        model = backend.open(path, options)
    except BaseException as exc:
        conn.send(("err", portable(exc)))
        return
    conn.send(("ok", (list(model.inputs), list(model.outputs))))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            break
        if method == "close":
            model.close()
            conn.send(("ok", None))
            break
        try:
            if method == "dump_layers":
                for layer in model.dump_layers(*args):
                    conn.send(("item", layer))
                conn.send(("ok", _END))
            else:
                conn.send(("ok", getattr(model, method)(*args)))
        except BaseException as exc:
            conn.send(("err", portable(exc)))


def same_backend(backend: Backend) -> Backend:
    """The factory of a backend built in the daemon: pickled with it, it makes the worker import only the
    backend's module (not the daemon's, with its gRPC server and metrics)."""
    return backend


def _portable(exc: BaseException, budget: int) -> BackendError:
    """Exceptions cross the pipe as backend errors with the original text; an allocation that failed
    under the memory cap is the session's budget, said in the client's terms."""
    if budget and (isinstance(exc, MemoryError) or any(s in str(exc) for s in _ALLOCATION_FAILURES)):
        return OverBudget(
            f"the model needs more memory than the session budget max_session_memory={budget} "
            "(--max-session-memory) allows"
        )
    if isinstance(exc, BackendError):
        return exc
    return ExecutionError(f"{type(exc).__name__}: {exc}")


def _listed(formats: Sequence[InputFormat] | None) -> list[InputFormat] | None:
    return None if formats is None else list(formats)


class IsolatedRuntime(ModelRuntime):
    def __init__(
        self,
        factory: BackendFactory,
        path: Path,
        options: RuntimeOptions,
        call_timeout_s: float | None,
        on_lost: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`on_lost("timeout" | "died")` is told of each worker killed or found dead (for the metrics)."""
        self._on_lost = on_lost
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._timeout = call_timeout_s
        self._busy = False
        self._process = ctx.Process(target=_serve, args=(child, factory, path, options), daemon=True)
        self._process.start()
        child.close()
        open_timeout = max(call_timeout_s, _OPEN_TIMEOUT_S) if call_timeout_s is not None else None
        self.inputs, self.outputs = self._receive("open", open_timeout)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _receive(self, method: str, timeout: float | None = None) -> Any:
        timeout = timeout if timeout is not None else self._timeout
        if not self._conn.poll(timeout):
            self.kill()
            self._on_lost("timeout")
            raise WorkerLost(
                f"the runtime did not answer {method} within {timeout}s; its worker process was killed "
                "and this session is broken (init_runtime again)"
            )
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            code = self._process.exitcode
            self.kill()
            self._on_lost("died")
            raise WorkerLost(
                f"the runtime's worker process died during {method} (exit code {code}); "
                "this session is broken (init_runtime again)"
            ) from None
        if kind == "err":
            raise value
        return value if kind == "ok" else (kind, value)

    def _call(self, method: str, *args: Any) -> Any:
        if not self._process.is_alive():
            raise WorkerLost("this session's worker process is gone; call init_runtime again")
        self._busy = True
        try:
            self._conn.send((method, args))
            return self._receive(method)
        finally:
            self._busy = False

    def run(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> list[np.ndarray]:
        result: list[np.ndarray] = self._call("run", list(inputs), _listed(formats))
        return result

    def perf(self, inputs: Sequence[np.ndarray] | None) -> EvalPerfResponse:
        result: EvalPerfResponse = self._call("perf", None if inputs is None else list(inputs))
        return result

    def memory(self) -> EvalMemoryResponse:
        result: EvalMemoryResponse = self._call("memory")
        return result

    def sdk_version(self) -> VersionInfo | None:
        result: VersionInfo | None = self._call("sdk_version")
        return result

    def input_shapes(self) -> list[InputShapes]:
        result: list[InputShapes] = self._call("input_shapes")
        return result

    def set_input_shapes(
        self, shapes: Sequence[tuple[int, ...]]
    ) -> tuple[list[TensorAttr], list[TensorAttr]]:
        result: tuple[list[TensorAttr], list[TensorAttr]] = self._call(
            "set_input_shapes", [tuple(shape) for shape in shapes]
        )
        return result

    def dump_layers(
        self, inputs: Sequence[np.ndarray], formats: Sequence[InputFormat] | None = None
    ) -> Iterator[LayerDump]:
        item = self._call("dump_layers", list(inputs), _listed(formats))
        while item != _END:
            _, layer = item
            try:
                yield layer
            except GeneratorExit:
                # Closed early: read the worker's remaining items, or the next call would get them.
                while item != _END:
                    item = self._receive("dump_layers")
                raise
            item = self._receive("dump_layers")

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=5)
        self._conn.close()

    def close(self) -> None:
        """Ask the worker to free the model; kill it if it is busy (shutdown) or does not answer."""
        if self._conn.closed:
            return
        try:
            if self._process.is_alive() and not self._busy:
                self._conn.send(("close", ()))
                if self._conn.poll(_CLOSE_GRACE_S):
                    self._conn.recv()
        except (OSError, EOFError):
            pass
        finally:
            self._process.join(timeout=_CLOSE_GRACE_S if not self._busy else 0)
            self.kill()


class IsolatedBackend(Backend):
    """A backend whose every model runs in a worker process of its own (--isolation process): an
    isolated backend is a backend, so whoever opens sessions does not know isolation exists."""

    def __init__(
        self,
        inner: Backend,
        call_timeout_s: float | None,
        on_lost: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.model_suffixes = inner.model_suffixes
        self.capabilities = inner.capabilities
        self.unpinned_reason = inner.unpinned_reason
        self.parallel_runs = inner.parallel_runs
        self._timeout = call_timeout_s
        self._on_lost = on_lost

    def version(self) -> VersionInfo:
        return self.inner.version()

    def soc(self) -> str:
        return self.inner.soc()

    def frequencies(self) -> tuple[FrequencyList, ...]:
        return self.inner.frequencies()

    @contextmanager
    def measuring(self, fix_freq: bool) -> Iterator[FrequencyOutcome]:
        with self.inner.measuring(fix_freq) as pinned:
            yield pinned

    def open(self, model_path: Path, options: RuntimeOptions) -> ModelRuntime:
        factory = functools.partial(same_backend, self.inner)
        return IsolatedRuntime(factory, model_path, options, self._timeout, self._on_lost)
