"""The protocol-neutral half of KServe v2: models by name and version, their sessions, the tensor intake.

Both transports (grpc_service.py, rest.py) decode their messages into `InputTensor`s and call here.
A model is a folder of the model repository (its name; the versions its layout serves, "1" for the
project's own layout) or a model uploaded through rknn.v1 (its digest is its name; the one version
"1"). A request without a version gets the highest served. Runs go through the data plane like
rknn.v1's: each caller gets a small pool of sessions per model (session_pools.py: as many as run side
by side to good effect, bounded in all; the data plane's idle reaper may still close one, which is
then opened again), closed when its model is unloaded. Inputs are checked once (names, datatypes, shapes, byte counts, the tensor
limits) and then go through the same frame intake as rknn.v1 (`frames.plan_inputs`); a model keeps
its last request's intake for the next request that sends the same inputs (`CheckedRequest`).

Tenancy: repository models are shared by name, with every caller; a model uploaded through rknn.v1
is its owners' only (model_cache.py): every call takes the caller's identity, and to anyone else
such a model is as unknown as a digest never uploaded (the index leaves it out, it is not ready,
everything else is NOT_FOUND). Its statistics and sessions are each owner's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
import structlog

from rknn_proto import codec, rknn_pb2
from rknn_proto.manifest import valid_digest
from rknn_proto.messages import QuantType, TensorAttr, in_layout
from rknn_server import __version__
from rknn_server.core.data_plane import DataPlane, OpenRequest, Ran
from rknn_server.core.frames import Declared, InputPlan, arrange, plan_inputs, wire_arrays
from rknn_server.core.sessions import Session
from rknn_server.errors import InvalidInput, NotFound, ServiceError, status_of
from rknn_server.protocols.kserve.batcher import DynamicBatcher
from rknn_server.protocols.kserve.datatypes import checked_shape, datatype_of, dtype_of
from rknn_server.protocols.kserve.pbtxt import CONFIG_PBTXT, DeclaredTensor
from rknn_server.protocols.kserve.repository import ModelConfig, ModelFolder, ModelRepository, TensorConfig
from rknn_server.protocols.kserve.session_pools import SessionPools
from rknn_server.protocols.kserve.system_shm import RegionSlot, SystemRegions
from rknn_server.runtime.base import InputFormat, ModelFormatError

log = structlog.get_logger("rknn_server.kserve")

VERSION = "1"  # the version of an uploaded model, and of a repository model in the project's layout
SERVER_NAME = "rknn_server"
EXTENSIONS = ("model_repository", "binary_tensor_data", "statistics")
REPOSITORY_OWNER = "model-repository"  # who opens a model once when it is loaded, to check it
_PLATFORMS = {".onnx": "onnxruntime_onnx", ".rknn": "rknn"}


class ModelUnavailable(ServiceError):
    """A model that exists but is not ready (its load failed, or it was unloaded)."""

    code = grpc.StatusCode.UNAVAILABLE


@dataclass(frozen=True)
class InputTensor:
    """One input as a client sent it: its bytes (raw contents) or its elements (typed contents, JSON)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview | None = None
    values: Sequence[object] | np.ndarray | None = None
    # Where this transport's client puts an input's elements, for a message that names them.
    carriers: str = "contents or raw_input_contents"
    region: RegionSlot | None = None  # its bytes are in the caller's system shared memory


# What the intake reads of a request's input sent as raw bytes: its name, datatype, shape and byte count.
RequestKey = tuple[tuple[str, str, tuple[int, ...], int], ...]


@dataclass(frozen=True, slots=True)
class CheckedRequest:
    """A request's inputs as they passed the intake (V2Models._intake): names, datatypes, shapes and
    byte counts against the model and the tensor limits, and frames.plan_inputs's plans. A model
    keeps the last one, and a request sending the same inputs as raw bytes takes it: every check is
    a pure function of the key, the limits and the model. In place in the daemon, a tiny model's
    ModelInfer spent 39 us in this intake, and 12 us taking the kept one."""

    key: RequestKey
    limits: codec.TensorLimits
    order: tuple[int, ...]  # where in the request each of the model's inputs is, in the model's order
    layouts: tuple[tuple[np.dtype, tuple[int, ...]], ...]  # each one's dtype and shape, in that order
    plans: list[InputPlan]


def request_key(inputs: Sequence[InputTensor]) -> RequestKey | None:
    """The key of a request whose inputs all came as raw bytes (the binary tensors of gRPC and REST);
    None for any other (typed contents, JSON elements: their values are checked every time)."""
    key = []
    for tensor in inputs:
        if tensor.raw is None or tensor.region is not None:
            return None
        key.append((tensor.name, tensor.datatype, tensor.shape, len(tensor.raw)))
    return tuple(key)


@dataclass(frozen=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray
    region: RegionSlot | None = None  # written into the caller's system shared memory, not the reply

    def wire_bytes(self) -> memoryview:
        """The output's bytes as a reply carries them: its array's own memory, not a copy."""
        return np.ascontiguousarray(self.array).data.cast("B")


@dataclass(frozen=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: any size


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]
    max_batch_size: int = 0  # Triton's model configuration: > 0 when the first dimension is the batch


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: str
    state: str  # READY | UNAVAILABLE
    reason: str = ""


@dataclass(frozen=True)
class Phases:
    """One successful request's time (ns) in each phase Triton splits it into: `queue` waiting for its
    session, `input` its tensors into the runtime's inputs, `infer` the runtime's run, `output` the
    outputs into the reply's tensors; `batch` is its batch size (1 unless the model batches)."""

    batch: int
    queue_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int


@dataclass
class InferenceStats:
    """A model's inference requests since it was loaded (Triton's statistics extension): how many
    succeeded and failed and their time in the daemon, from the request's arrival to its outputs, and
    the successful ones' phases summed (each counts every success). Queue and infer are the
    intervals the Prometheus histograms observe (DataPlane.alone measures both)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    inference_count: int = 0  # the successful requests' batch elements (Triton counts each)
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    last_inference_ms: int = 0  # since the epoch; 0 before the first

    def succeeded(self, elapsed_ns: int, phases: Phases) -> None:
        self.success_count += 1
        self.success_ns += elapsed_ns
        self.inference_count += phases.batch
        self.queue_ns += phases.queue_ns
        self.compute_input_ns += phases.input_ns
        self.compute_infer_ns += phases.infer_ns
        self.compute_output_ns += phases.output_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def failed(self, elapsed_ns: int) -> None:
        self.fail_count += 1
        self.fail_ns += elapsed_ns
        self.last_inference_ms = time.time_ns() // 1_000_000


@dataclass
class Model:
    """A model as v2 clients address it; `inputs`/`outputs` are known once it was opened."""

    name: str
    digest: str
    platform: str
    config: ModelConfig = field(default_factory=ModelConfig)
    inputs: tuple[TensorAttr, ...] = ()
    outputs: tuple[TensorAttr, ...] = ()
    stats: InferenceStats = field(default_factory=InferenceStats)
    shared: bool = False  # a repository model, for every caller (else one owner's view of an upload)
    version: str = VERSION
    # The repository's session that keeps this version loaded while it is READY, where the runtime's
    # sessions share a loaded model (Backend.shares_models); closed when the version goes.
    resident: str = ""
    # What every request asks of the tensors, made once they are known (learn): their names, and the
    # outputs as v2 describes them (the reply rule weighs them before each run).
    _input_names: list[str] = field(default_factory=list, repr=False)
    _output_names: list[str] = field(default_factory=list, repr=False)
    output_metadata: tuple[TensorMetadata, ...] = field(default=(), repr=False)
    # Its last request's intake, for the next request sending the same inputs (CheckedRequest).
    checked: CheckedRequest | None = field(default=None, repr=False, compare=False)

    @property
    def max_batch_size(self) -> int:
        """Triton's: 0 unless the model's config.pbtxt says it batches (its first dimension)."""
        return self.config.triton.max_batch_size if self.config.triton else 0

    def input_names(self) -> list[str]:
        return self._input_names

    def output_names(self) -> list[str]:
        return self._output_names

    def input_layout(self, index: int) -> str:
        """The layout clients send input `index` in (the config's, else the model's)."""
        configured = self.config.inputs[index].layout if self.config.inputs else ""
        return configured or self.inputs[index].layout

    def learn(self, session: Session) -> None:
        """Take the tensors of the opened model; the config must name as many as it has."""
        inputs, outputs = tuple(session.runtime.inputs), tuple(session.runtime.outputs)
        for key, configured, specs in (
            ("inputs", self.config.inputs, inputs),
            ("outputs", self.config.outputs, outputs),
        ):
            if configured and len(configured) != len(specs):
                raise ModelUnavailable(
                    f"model {self.name!r}: config.toml describes {len(configured)} {key}, the model has "
                    f"{len(specs)} ({', '.join(s.name for s in specs)})"
                )
        if self.config.triton:
            for declared, specs, dtype_of_spec in (
                (self.config.triton.inputs, inputs, lambda s: s.dtype),
                (self.config.triton.outputs, outputs, _output_dtype),
            ):
                for tensor in declared:
                    self._check_declared(tensor, specs, dtype_of_spec)
        self.inputs, self.outputs = inputs, outputs
        self._input_names = _names(inputs, self.config.inputs)
        self._output_names = _names(outputs, self.config.outputs)
        self.output_metadata = tuple(
            TensorMetadata(n, datatype_of(_output_dtype(s)), _client_shape(s, s.layout))
            for n, s in zip(self._output_names, outputs, strict=True)
        )

    def _check_declared(
        self,
        tensor: DeclaredTensor,
        specs: Sequence[TensorAttr],
        dtype_of_spec: Callable[[TensorAttr], np.dtype],
    ) -> None:
        """A tensor config.pbtxt declares must be the model's, as Triton checks: name, datatype, dims
        (after the batch dimension when the model batches; -1 matches any size)."""
        where = f"model {self.name!r}: {CONFIG_PBTXT}"
        spec = next((s for s in specs if s.name == tensor.name), None)
        if spec is None:
            raise ModelUnavailable(
                f"{where} declares {tensor.name[:80]!r}, which the model does not have "
                f"(it has {', '.join(s.name for s in specs)})"
            )
        datatype = datatype_of(dtype_of_spec(spec))
        if tensor.datatype and tensor.datatype != datatype:
            raise ModelUnavailable(
                f"{where}: {tensor.name!r} is declared TYPE_{tensor.datatype}; the model's is {datatype}"
            )
        shape = _client_shape(spec, spec.layout)
        if self.max_batch_size:
            if not shape or 0 < shape[0] < self.max_batch_size:
                raise ModelUnavailable(
                    f"{where}: max_batch_size {self.max_batch_size}, but {tensor.name!r} has shape "
                    f"{list(shape)}, whose first dimension takes at most {shape[0] if shape else 0}"
                )
            shape = shape[1:]
        if len(shape) != len(tensor.dims) or any(
            -1 not in (d, m) and d != m for d, m in zip(tensor.dims, shape, strict=True)
        ):
            batch = " after the batch dimension (max_batch_size > 0)" if self.max_batch_size else ""
            raise ModelUnavailable(
                f"{where}: {tensor.name!r} is declared with dims {list(tensor.dims)}; the model's are "
                f"{list(shape)}{batch}"
            )


def _names(specs: Sequence[TensorAttr], configured: Sequence[TensorConfig]) -> list[str]:
    return [
        (c.name if c.name else s.name)
        for s, c in zip(specs, configured or [TensorConfig()] * len(specs), strict=True)
    ]


def _output_dtype(spec: TensorAttr) -> np.dtype:
    """What an output travels as: quantized integers are dequantized to float32 (as rknn.v1 does)."""
    return (
        np.dtype("<f4") if spec.quant_type is not QuantType.NONE and spec.dtype.kind in "iu" else spec.dtype
    )


def _client_shape(spec: TensorAttr, layout: str) -> tuple[int, ...]:
    return in_layout(tuple(d if d > 0 else -1 for d in spec.shape), spec.layout, layout)


class V2Models:
    """The models v2 clients see, and what they can do with them."""

    def __init__(
        self,
        plane: DataPlane,
        repository: ModelRepository | None,
        max_cached_sessions: int,
        regions: SystemRegions | None = None,
    ) -> None:
        self.plane = plane
        self.repository = repository
        self.regions = regions  # Triton's system shared memory (None: not offered)
        # (name, version) of repository models with dynamic_batching (two may hold the same bytes)
        self._batchers: dict[tuple[str, str], DynamicBatcher] = {}
        # Twice the runs that compute side by side: the next run of each core waits at the runtime's
        # gate (a thread's hand-off), not in the event loop's queue of a busy session.
        self.sessions = SessionPools(plane, max_cached_sessions, 2 * plane.backend.parallel_runs)
        self._loaded: dict[str, dict[str, Model]] = {}  # repository models that are ready, by version
        self._unavailable: dict[str, str] = {}  # repository model -> why it is not ready
        # (digest, owner) -> that owner's view of an uploaded model, bounded
        self._uploaded: OrderedDict[tuple[str, str], Model] = OrderedDict()
        # uploaded model -> why the runtime could not load it (as Triton keeps a failed load's reason)
        self._unloadable: OrderedDict[str, str] = OrderedDict()

    # -- Lookup --------------------------------------------------------------------------------

    def resolve(self, name: str, version: str, owner: str) -> Model:
        """The model `name` at `version` ("": the highest served) as `owner` may use it; NOT_FOUND or
        UNAVAILABLE with the reason."""
        versions = self._loaded.get(name)
        if versions is None:
            if name in self._unavailable:
                raise ModelUnavailable(f"model {name!r} is not ready: {self._unavailable[name]}")
            versions = {VERSION: self._uploaded_model(name, owner)}
        if not version:
            return versions[max(versions, key=int)]
        if version not in versions:
            served = ", ".join(sorted(versions, key=int))
            raise NotFound(f"model {name!r} has no version {version[:32]!r}; its version(s) served: {served}")
        return versions[version]

    def _uploaded_model(self, name: str, owner: str) -> Model:
        """`owner`'s view of the uploaded model `name`; NOT_FOUND, the same for a model that is not
        there and one that is someone else's."""
        if not self.plane.cache.may_use(name, owner):
            known = ", ".join(sorted(self._loaded)[:10]) or "none"
            raise NotFound(
                f"unknown model {name[:80]!r}; the repository's ready models are: {known}, and a model uploaded "
                "through rknn.v1 is addressed by its digest (64 hex characters)"
            )
        key = (name, owner)
        model = self._uploaded.get(key)
        # Its main file is looked at once per (model, caller), not on every request.
        why = self._not_a_model(name, owner) if model is None else self._unloadable.get(name, "")
        if why:
            raise ModelUnavailable(f"model {name[:80]!r} is not ready: {why}")
        if model is None:
            suffix = "." + self.plane.cache.main_file(name, owner).name.rpartition(".")[2]
            model = Model(name, name, _PLATFORMS.get(suffix, self.plane.backend.name))
            self._uploaded[key] = model
            while len(self._uploaded) > 256:
                self._uploaded.popitem(last=False)
        self._uploaded.move_to_end(key)
        return model

    def _not_a_model(self, digest: str, owner: str) -> str:
        """Why the uploaded file `digest` is no model this runtime loads ('' when it may be one): its
        suffix, else a load that failed."""
        file_name = self.plane.cache.main_file(digest, owner).name
        suffixes = self.plane.backend.model_suffixes
        if not file_name.lower().endswith(tuple(suffixes)):
            return f"{file_name} is not a model this daemon's runtime loads (it loads {', '.join(suffixes)} files)"
        return self._unloadable.get(digest, "")

    def ready(self, name: str, version: str, owner: str) -> bool:
        try:
            self.resolve(name, version, owner)
        except ServiceError:
            return False
        return True

    def index(self, ready_only: bool, owner: str) -> list[IndexEntry]:
        """Every repository folder with its state, then the uploaded models `owner` may use (ready:
        they are cached)."""
        names = set(self._loaded) | set(self._unavailable)
        if self.repository is not None:
            names |= set(self.repository.names())
        entries = [
            entry
            for name in sorted(names)
            for entry in (
                [IndexEntry(name, v, "READY") for v in sorted(self._loaded[name], key=int)]
                if name in self._loaded
                else [IndexEntry(name, VERSION, "UNAVAILABLE", self._unavailable.get(name, "not loaded"))]
            )
        ]
        for digest in self.plane.cache.cached_digests():
            if self.plane.cache.may_use(digest, owner):
                why = self._not_a_model(digest, owner)
                entries.append(IndexEntry(digest, VERSION, "UNAVAILABLE" if why else "READY", why))
        return [e for e in entries if e.state == "READY" or not ready_only]

    # -- Load and unload -------------------------------------------------------------------------

    async def load(self, name: str, owner: str) -> Model:
        """(Re)load a repository model (anyone may: it is shared): read its folder, bring it into the
        cache, open it once to check it. Without a repository, `owner`'s uploaded model is just found."""
        if self.repository is None:
            if valid_digest(name):
                return self.resolve(name, "", owner)
            raise NotFound("this daemon has no model repository (--model-repository)")
        versions: dict[str, Model] = {}
        try:
            for folder in self.repository.read(name):
                versions[folder.version] = await self._import(folder)
        except Exception as exc:
            await self._close_residents(versions.values())  # the versions this load got to
            if isinstance(exc, NotFound):  # the folder is gone: what was loaded before still serves
                raise
            await self._drop_old(name)  # before _unload, which forgets the versions it drops
            self._unload(name, status_of(exc)[1])
            log.warning("model_load_failed", model=name, error=f"{type(exc).__name__}: {exc}")
            raise
        old = self._loaded.get(name, {})
        self._unavailable.pop(name, None)
        self._loaded[name] = versions
        await self._close_residents(old.values())
        kept = {m.digest for m in versions.values()}
        for gone in {m.digest for m in old.values()} - kept:
            await self.sessions.drop(gone)
        model = versions[max(versions, key=int)]
        triton = model.config.triton
        log.info(
            "model_loaded",
            model=name,
            versions=sorted(versions, key=int),
            digest=model.digest[:12],
            **({"passed_over": list(triton.passed_over)} if triton and triton.passed_over else {}),
        )
        return model

    async def _import(self, folder: ModelFolder) -> Model:
        """One version of a repository model: into the cache, then opened once to check it."""
        assert self.repository is not None
        digest = await self.plane.blocking(self.repository.import_into, folder, self.plane.cache)
        suffix = "." + folder.files[0].rpartition(".")[2]
        platform = _PLATFORMS.get(suffix, self.plane.backend.name)
        model = Model(folder.name, digest, platform, folder.config, shared=True, version=folder.version)
        triton = folder.config.triton
        key = (folder.name, folder.version)
        if triton is not None and triton.batching is not None:
            self._batchers[key] = DynamicBatcher(
                self.run_batch, triton.max_batch_size, triton.batching, self.plane.backend.parallel_runs
            )
        else:
            self._batchers.pop(key, None)
        resident = self.plane.backend.shares_models
        probe = await self.plane.open(
            OpenRequest(digest=digest, owner=REPOSITORY_OWNER, shared=True, resident=resident)
        )
        try:
            model.learn(probe)
        except BaseException:
            await self.plane.close(probe.id, REPOSITORY_OWNER)
            raise
        if resident:  # kept open: the first request finds the model loaded, as READY promises
            model.resident = probe.id
        else:
            await self.plane.close(probe.id, REPOSITORY_OWNER)
        return model

    async def _close_residents(self, models: Iterable[Model]) -> None:
        for model in models:
            resident, model.resident = model.resident, ""
            if resident:
                with contextlib.suppress(ServiceError):  # the daemon is stopping and closed it
                    await self.plane.close(resident, REPOSITORY_OWNER)

    async def run_batch(
        self, sessions: list[Session], arrays: list[np.ndarray], formats: list[InputFormat]
    ) -> Ran:
        """A dynamic batch, in a session of its requests that is not busy, else in one of the first
        caller's pool (which opens another while the runtime computes more at once to good effect)."""
        free = next((s for s in sessions if not s.lock.locked()), None)
        if free is None:
            free, _ = await self.sessions.get(sessions[0].digest, sessions[0].owner, shared=True)
        return await self.plane.run(free, arrays, formats)

    async def load_all(self) -> None:
        """Load every repository model (start-up); a model that fails is UNAVAILABLE, with the reason."""
        for name in self.repository.names() if self.repository else []:
            with contextlib.suppress(Exception):  # logged, and kept as the model's state
                await self.load(name, REPOSITORY_OWNER)

    async def unload(self, name: str, owner: str) -> None:
        """Unload a repository model (for everyone), or close `owner`'s own sessions of its uploaded
        model (other owners' stay)."""
        if name not in self._loaded and name not in self._unavailable:
            self.resolve(name, "", owner)  # raises NOT_FOUND with the known names
            await self.sessions.drop(name, owner)
            return
        await self._drop_old(name)
        self._unload(name, "unloaded")

    async def _drop_old(self, name: str) -> None:
        for old in self._loaded.get(name, {}).values():
            await self.sessions.drop(old.digest)
        await self._close_residents(self._loaded.get(name, {}).values())

    def _unload(self, name: str, reason: str) -> None:
        self._loaded.pop(name, None)
        self._unavailable[name] = reason

    # -- Metadata and inference ----------------------------------------------------------------

    async def _session(self, model: Model, owner: str) -> Session:
        """A session of the caller's pool. A repository model evicted from the cache is brought in
        again, found when a session must be opened (a model with a live session is pinned, so the
        request that finds one looks at no file)."""
        try:
            try:
                session, opened = await self.sessions.get(model.digest, owner, model.shared)
            except NotFound:
                if model.name not in self._loaded or self.plane.cache.has(model.digest):
                    raise
                await self.load(model.name, owner)
                session, opened = await self.sessions.get(model.digest, owner, model.shared)
        except ModelFormatError as exc:
            if not model.shared:  # an upload the runtime cannot load: UNAVAILABLE from now on
                self._unloadable[model.digest] = str(exc)
                while len(self._unloadable) > 256:
                    self._unloadable.popitem(last=False)
            raise
        if opened or not model.inputs:
            model.learn(session)
        return session

    async def metadata(self, name: str, version: str, owner: str) -> ModelMetadata:
        model = self.resolve(name, version, owner)
        if not model.inputs:
            await self._session(model, owner)
        inputs = tuple(
            TensorMetadata(n, datatype_of(s.dtype), _client_shape(s, model.input_layout(i)))
            for i, (n, s) in enumerate(zip(model.input_names(), model.inputs, strict=True))
        )
        versions = tuple(sorted(self._loaded[name], key=int)) if model.shared else (VERSION,)
        return ModelMetadata(
            model.name, versions, model.platform, inputs, model.output_metadata, model.max_batch_size
        )

    async def infer(
        self,
        name: str,
        version: str,
        owner: str,
        inputs: Sequence[InputTensor],
        requested: Sequence[str],
        check_reply: Callable[[Sequence[TensorMetadata]], None] | None = None,
        output_regions: Mapping[str, RegionSlot] | None = None,
    ) -> tuple[Model, list[OutputTensor]]:
        """Run one request; the outputs named in `requested` (all when empty), in the model's order,
        those in `output_regions` written into the caller's shared memory. `check_reply` weighs the
        reply by the model's output shapes before compute (the door's reply rule)."""
        model = self.resolve(name, version, owner)
        if check_reply is not None:
            if not model.outputs:
                await self._session(model, owner)
            check_reply(model.output_metadata)
        started = time.perf_counter_ns()
        try:
            outputs, phases = await self._infer(model, owner, inputs, requested, output_regions or {})
        except BaseException:
            model.stats.failed(time.perf_counter_ns() - started)
            raise
        model.stats.succeeded(time.perf_counter_ns() - started, phases)
        return model, outputs

    async def _infer(
        self,
        model: Model,
        owner: str,
        inputs: Sequence[InputTensor],
        requested: Sequence[str],
        output_regions: Mapping[str, RegionSlot],
    ) -> tuple[list[OutputTensor], Phases]:
        """The request's outputs, and its phases (the session's opening, on first use, is in none)."""
        session = await self._session(model, owner)
        began = time.perf_counter_ns()
        inputs = [await self._from_region(owner, t) if t.region else t for t in inputs]
        arrays, ready, formats = self._intake(model, inputs)
        names = model.output_names()
        unknown = sorted(set(requested) - set(names))
        if unknown:
            raise InvalidInput(
                f"model {model.name!r} has no output(s) {unknown[:5]}; its outputs: {', '.join(names)}"
            )
        running = time.perf_counter_ns()
        batcher = self._batchers.get((model.name, model.version)) if model.shared else None
        ran = await (
            batcher.run(session, ready, formats) if batcher else self.plane.run(session, ready, formats)
        )
        ran_ns = time.perf_counter_ns()
        wire = wire_arrays(ran.outputs, model.outputs, native=False)
        outputs = [
            OutputTensor(n, datatype_of(a.dtype), tuple(a.shape), a, output_regions.get(n))
            for n, a in zip(names, wire, strict=True)
            if not requested or n in requested
        ]
        for output in outputs:
            if output.region:
                await self._into_region(owner, output)
        batch = arrays[0].shape[0] if model.max_batch_size and arrays else 1
        times = ran.times
        ended = time.perf_counter_ns()
        return outputs, Phases(batch, times.queue_ns, running - began, times.compute_ns, ended - ran_ns)

    def _shared(self, what: str) -> SystemRegions:
        if self.regions is None:
            raise InvalidInput(f"{what} names a shared-memory region; this daemon offers none")
        return self.regions

    async def _from_region(self, owner: str, tensor: InputTensor) -> InputTensor:
        """The input with its bytes read from the caller's region: a slot of exactly the bytes its
        datatype and shape take, checked against the tensor limits before anything is read."""
        assert tensor.region is not None
        what = f"input {tensor.name!r}"
        regions = self._shared(what)
        _, _, nbytes = checked_meta(tensor, self.plane.tensor_limits)
        if tensor.region.byte_size != nbytes:
            raise InvalidInput(
                f"{what}: shared_memory_byte_size {tensor.region.byte_size} for shape {list(tensor.shape)} of "
                f"{tensor.datatype}; expected {nbytes}"
            )
        region, offset = regions.slot(owner, tensor.region, what)
        with regions.in_use(region):
            data = await self.plane.blocking(regions.read, region, offset, nbytes, what)
        return dataclasses.replace(tensor, raw=data.data, region=None)

    async def _into_region(self, owner: str, output: OutputTensor) -> None:
        """An output written into the caller's region; it must fit the slot the request named."""
        assert output.region is not None
        what = f"output {output.name!r}"
        regions = self._shared(what)
        region, offset = regions.slot(owner, output.region, what)
        if output.array.nbytes > output.region.byte_size:
            raise InvalidInput(
                f"{what} is {output.array.nbytes} bytes ({output.datatype} {list(output.shape)}), over its "
                f"shared_memory_byte_size {output.region.byte_size}"
            )
        with regions.in_use(region):
            await self.plane.blocking(region.write, output.array, offset)

    def _intake(
        self, model: Model, inputs: Sequence[InputTensor]
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[InputFormat]]:
        """The request's inputs in the model's order as arrays, checked against names, limits and sizes
        and planned by the frame intake; those arrays arranged for the runtime, and their formats.
        A request sending what the model's last one sent takes that one's checks (CheckedRequest)."""
        limits = self.plane.tensor_limits
        key = request_key(inputs)
        last = model.checked
        if key is not None and last is not None and last.key == key and last.limits is limits:
            arrays = [
                raw_array(inputs[at].raw, dtype, shape)  # type: ignore[arg-type]  # raw: in the key
                for at, (dtype, shape) in zip(last.order, last.layouts, strict=True)
            ]
            plans = last.plans
        else:
            arrays, declared, order = self._checked_arrays(model, inputs, limits)
            plans = plan_inputs(model.inputs, declared)
            if key is not None:
                layouts = tuple((a.dtype, tuple(a.shape)) for a in arrays)
                model.checked = CheckedRequest(key, limits, order, layouts, plans)
        return arrays, arrange(arrays, plans), [plan.format for plan in plans]

    def _checked_arrays(
        self, model: Model, inputs: Sequence[InputTensor], limits: codec.TensorLimits
    ) -> tuple[list[np.ndarray], list[Declared], tuple[int, ...]]:
        """The request's inputs in the model's order as arrays, checked against names, limits and
        sizes; as the frame intake declares them; where each one is in the request."""
        names = model.input_names()
        if len(inputs) > limits.max_tensors:
            raise InvalidInput(f"{len(inputs)} inputs sent; the model {model.name!r} has {len(names)}")
        by_name: dict[str, int] = {}
        for at, tensor in enumerate(inputs):
            if tensor.name not in names:
                raise InvalidInput(
                    f"model {model.name!r} has no input {tensor.name[:80]!r}; its inputs: {', '.join(names)}"
                )
            if tensor.name in by_name:
                raise InvalidInput(f"input {tensor.name!r} is sent twice")
            by_name[tensor.name] = at
        missing = [n for n in names if n not in by_name]
        if missing:
            raise InvalidInput(
                f"input(s) {', '.join(missing)} missing; model {model.name!r} takes {', '.join(names)}"
            )
        arrays, declared = [], []
        for index, name in enumerate(names):
            tensor = inputs[by_name[name]]
            array = to_array(tensor, limits)
            if model.max_batch_size and (not array.ndim or array.shape[0] > model.max_batch_size):
                raise InvalidInput(
                    f"input {name!r} has shape {list(array.shape)}: its first dimension is the batch, at most "
                    f"{model.max_batch_size} (max_batch_size in the model's {CONFIG_PBTXT})"
                )
            arrays.append(array)
            declared.append(Declared(array.dtype, tuple(array.shape), model.input_layout(index)))
        return arrays, declared, tuple(by_name[name] for name in names)

    def statistics(self, name: str, version: str, owner: str) -> list[Model]:
        """The model `name` for its statistics (each version served when `version` is empty, as Triton
        answers), or every ready model `owner` may use when `name` is empty."""
        if name and not version and name in self._loaded:
            return [self._loaded[name][v] for v in sorted(self._loaded[name], key=int)]
        if name:
            return [self.resolve(name, version, owner)]
        mine = [
            m
            for (digest, o), m in self._uploaded.items()
            if o == owner and self.plane.cache.may_use(digest, o)
        ]
        return [*(m for versions in self._loaded.values() for m in versions.values()), *mine]

    def server_metadata(self) -> tuple[str, str, tuple[str, ...]]:
        return SERVER_NAME, __version__, EXTENSIONS


def checked_meta(tensor: InputTensor, limits: codec.TensorLimits) -> tuple[np.dtype, tuple[int, ...], int]:
    """An input's dtype, shape and byte count, after its datatype and shape are checked against the
    tensor limits (before any of its bytes are read)."""
    what = f"input {tensor.name!r}"
    dtype = dtype_of(tensor.datatype, what)
    shape = checked_shape(tensor.shape, dtype, what)
    count = math.prod(shape) if min(shape, default=0) >= 0 else 0
    codec.check_meta(
        rknn_pb2.TensorMeta(
            dtype=codec.dtype_to_wire(dtype), shape=shape, byte_length=count * dtype.itemsize
        ),
        limits,
        what,
    )
    return dtype, shape, count * dtype.itemsize


def raw_array(raw: bytes | memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Raw contents of exactly the bytes `shape` of `dtype` takes, as that array, where they lie.
    Bytes read where they lay in a message (parse_infer_request) may sit at an address that does not
    suit the datatype: one copy then, which is aligned."""
    array = np.frombuffer(raw, dtype).reshape(shape)
    return array if array.flags.aligned else array.copy()


def to_array(tensor: InputTensor, limits: codec.TensorLimits) -> np.ndarray:
    """An input's array, after its datatype, its shape (the tensor limits) and its byte count are checked."""
    what = f"input {tensor.name!r}"
    dtype, shape, nbytes = checked_meta(tensor, limits)
    count = nbytes // dtype.itemsize
    if tensor.raw is not None:
        if len(tensor.raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"{what}: {len(tensor.raw)} bytes of raw contents for shape {list(shape)} of {tensor.datatype}; "
                f"expected {count * dtype.itemsize} bytes"
            )
        return raw_array(tensor.raw, dtype, shape)
    values = tensor.values if tensor.values is not None else ()
    if len(values) != count:
        raise InvalidInput(
            f"{what}: {len(values)} elements for shape {list(shape)}; expected {count} "
            f"(no contents at all: send them in {tensor.carriers})"
        )
    try:
        given = np.asarray(values)
        array = given.astype(dtype)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{what}: its elements are not {tensor.datatype} values") from None
    if given.dtype.kind not in "biuf" or (dtype.kind != "f" and not np.array_equal(array, given)):
        raise InvalidInput(
            f"{what}: its elements are not {tensor.datatype} values (out of range or wrong type)"
        )
    return array.reshape(shape)


__all__ = [
    "IndexEntry",
    "InputTensor",
    "Model",
    "ModelMetadata",
    "ModelUnavailable",
    "OutputTensor",
    "TensorMetadata",
    "V2Models",
    "to_array",
]
