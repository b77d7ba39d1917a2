"""The idiomatic client API: `connect()` gives a Device, `Device.load()` a Session.

    with rknn_client.connect("tcp://board:50515") as device:
        with device.load("model.onnx") as session:
            outputs = session.run([image])

Errors are exceptions (see rknn_client.errors) carrying the daemon's message. This layer is strict:
inputs must have the model's dtype and shape; the RKNN-Toolkit2 conveniences live in rknn_client.compat.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc
import numpy as np

from rknn_client import __version__
from rknn_client.digest_cache import DigestCache
from rknn_client.errors import InvalidInput, RknnError, SessionLost, VersionMismatch, from_rpc_error
from rknn_client.model_files import model_files
from rknn_client.negotiate import check_versions
from rknn_client.pipeline import Pipeline, ordered_map
from rknn_client.transport.base import Endpoint
from rknn_client.transport.resolve import resolve
from rknn_client.transport.security import Credentials, open_channel
from rknn_client.upload_stream import UPLOAD_METHOD, upload_chunk_bytes, upload_requests
from rknn_proto import codec, manifest, rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_METADATA_KEY,
    RUN_RPC_VERSION,
)

T = TypeVar("T")
Progress = Callable[[int, int], None]
# Re-opens a lost session on a restarted daemon: the new InitRuntime reply and the model bytes re-sent.
Reopen = Callable[[], tuple[rknn_pb2.InitRuntimeResponse, int]]
_METADATA = ((PROTOCOL_VERSION_METADATA_KEY, str(PROTOCOL_VERSION)),)
# Concurrent uploads of one model: how often and how long to wait for the other one (about a minute).
_UPLOAD_RETRIES = 600
_UPLOAD_RETRY_S = 0.1
# The client trusts its daemon but still bounds what it allocates for outputs.
_OUTPUT_LIMITS = codec.TensorLimits(max_tensor_bytes=16 << 30, max_rank=32, max_tensors=4096)
_QUANT_NAMES = {
    rknn_pb2.QUANT_TYPE_NONE: "none",
    rknn_pb2.QUANT_TYPE_AFFINE_ASYMMETRIC: "affine",
    rknn_pb2.QUANT_TYPE_DFP: "dfp",
}
_QUANT_CODES = {name: code for code, name in _QUANT_NAMES.items()}
# Set to 0 to have the daemon dequantize quantized outputs instead of sending their native integers.
NATIVE_OUTPUTS_ENV = "RKNN_NATIVE_OUTPUTS"
# Frames kept in flight by Session.map unless told otherwise.
DEFAULT_DEPTH = 4


def native_outputs_default() -> bool:
    """Native (quantized) outputs on the wire unless RKNN_NATIVE_OUTPUTS says 0/false/no/off."""
    return os.environ.get(NATIVE_OUTPUTS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as the daemon's runtime sees it."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str
    quant_type: str = "none"
    zero_point: int = 0
    scale: float = 1.0
    fl: int = 0

    @classmethod
    def from_wire(cls, attr: rknn_pb2.TensorAttr) -> TensorInfo:
        return cls(
            index=attr.index,
            name=attr.name,
            shape=tuple(attr.shape),
            dtype=codec.dtype_from_wire(attr.dtype),
            layout=codec.layout_name(attr.layout),
            quant_type=_QUANT_NAMES.get(attr.quant_type, "none"),
            zero_point=attr.zero_point,
            scale=attr.scale,
            fl=attr.fl,
        )

    @property
    def is_dynamic(self) -> bool:
        return any(d <= 0 for d in self.shape)

    def real_values(self, array: np.ndarray) -> np.ndarray:
        """The output's float32 values when `array` holds its quantized integers, else `array`."""
        code = _QUANT_CODES[self.quant_type]
        if not codec.is_native_quantized(array, code):
            return array
        return codec.dequantize(array, code, self.zero_point, self.scale, self.fl)


@dataclass(frozen=True)
class DeviceInfo:
    daemon_version: str
    protocol_version: int
    runtime: str
    runtime_version: str
    soc: str
    driver_version: str
    runtime_reason: str
    model_formats: tuple[str, ...]
    capabilities: dict[str, bool]
    limits: dict[str, float]
    open_sessions: int
    board: str
    instance_id: str = ""
    auth_required: bool = False
    tls: bool = False
    insecure: bool = False
    client_identity: str = ""
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class LayerRow:
    index: int
    op_type: str
    data_type: str
    target: str
    input_shapes: tuple[str, ...]
    output_shape: str
    time_us: float
    name: str
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PerfReport:
    layers: tuple[LayerRow, ...]
    total_time_us: float
    total_operator_time_us: float
    total_rw_kb: float
    frequencies: dict[str, tuple[int, ...]]
    frequencies_fixed: bool
    frequency_note: str
    raw_text: str
    extra_columns: tuple[str, ...]


@dataclass(frozen=True)
class MemoryReport:
    weight_memory: int
    internal_memory: int
    other_memory: int
    total_memory: int
    model_size: int
    method: str


@dataclass(frozen=True)
class DumpedLayer:
    """One layer tensor captured by the daemon's runtime during a DumpLayers run."""

    index: int
    op_type: str
    node_name: str
    tensor_name: str
    array: np.ndarray


@dataclass(frozen=True)
class UploadResult:
    digest: str
    sent_bytes: int
    cached: bool


class Device:
    """A connection to one daemon. Closing it closes the channel and undoes the transport."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        *,
        token: str | None = None,
        tls_ca: Path | str | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
    ) -> None:
        """`token` and the TLS files default to RKNN_SERVER_TOKEN and RKNN_SERVER_TLS_CA/_CERT/_KEY."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        # Sent with every call: the protocol version, plus e.g. a farm reservation token.
        self.metadata = (*_METADATA, *metadata)
        self._channel = open_channel(
            endpoint,
            Credentials.resolve(endpoint.token or token, tls_ca, tls_cert, tls_key),
            [
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # A restarted daemon is found again within about a second.
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = rknn_pb2_grpc.RknnServerStub(self._channel)
        self._info: DeviceInfo | None = None

    def _call(self, name: str, fn: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        try:
            return fn(request, metadata=self.metadata, timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, f"{name} on {self.endpoint.description}") from None

    def handshake(self, timeout: float = 30) -> rknn_pb2.GetInfoResponse:
        """GetInfo as the daemon answers it, whatever its protocol version (doctor and devices judge
        that themselves); raises RknnError."""
        return self._call(
            "GetInfo",
            self._stub.GetInfo,
            rknn_pb2.GetInfoRequest(
                client_protocol_version=PROTOCOL_VERSION,
                client_version=f"rknn_client {__version__} python {platform.python_version()} {platform.system()}",
            ),
            timeout=timeout,
        )

    def info(self, refresh: bool = False) -> DeviceInfo:
        """The daemon's description; the first call is the version handshake."""
        if self._info is None or refresh:
            reply = self.handshake()
            mismatch = check_versions(reply, self.endpoint.description, self.endpoint.device_id)
            if mismatch is not None:
                raise VersionMismatch(mismatch.message())
            caps = reply.capabilities
            limits = reply.limits
            self._info = DeviceInfo(
                daemon_version=reply.daemon_version,
                protocol_version=reply.protocol_version,
                runtime=reply.runtime,
                runtime_version=reply.runtime_version,
                soc=reply.soc,
                driver_version=reply.driver_version,
                runtime_reason=reply.runtime_reason,
                model_formats=tuple(reply.model_formats),
                capabilities={f.name: getattr(caps, f.name) for f in caps.DESCRIPTOR.fields},
                limits={f.name: getattr(limits, f.name) for f in limits.DESCRIPTOR.fields},
                open_sessions=reply.open_sessions,
                board=reply.board,
                instance_id=reply.instance_id,
                auth_required=reply.auth_required,
                tls=reply.tls,
                insecure=reply.insecure,
                client_identity=reply.client_identity,
                warnings=tuple(reply.warnings),
            )
        return self._info

    def upload(
        self, model: Path | str, progress: Progress | None = None, *, hashing: Progress | None = None
    ) -> UploadResult:
        """Send a model (and its external-data files) unless the daemon already has it; resumes.
        `progress` hears the bytes sent, `hashing` the bytes hashed first (a big model takes a while).

        When another client uploads the same model at the same time the daemon answers ABORTED; this
        waits for that upload and asks again (then the model is usually cached: nothing to send)."""
        for _ in range(_UPLOAD_RETRIES):
            try:
                return self._upload_once(model, progress, hashing)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.ABORTED:
                    raise from_rpc_error(exc, f"UploadModel on {self.endpoint.description}") from None
                time.sleep(_UPLOAD_RETRY_S)
        return self._upload_once(model, progress, hashing)

    def _upload_once(
        self, model: Path | str, progress: Progress | None, hashing: Progress | None = None
    ) -> UploadResult:
        paths = model_files(Path(model))
        hashed = 0
        to_hash = sum(p.stat().st_size for p in paths) if hashing else 0

        def hashed_more(size: int) -> None:
            nonlocal hashed
            hashed += size
            if hashing:
                hashing(hashed, to_hash)

        wire_manifest = manifest.describe_files(paths, hashed_more if hashing else None, DigestCache().sha256)
        by_name = {p.name: p for p in paths}
        prepared = self._call(
            "PrepareUpload", self._stub.PrepareUpload, rknn_pb2.PrepareUploadRequest(manifest=wire_manifest)
        )
        total = sum(f.size for f in wire_manifest.files)
        if prepared.cached:
            if progress:
                progress(total, total)
            return UploadResult(wire_manifest.digest, 0, cached=True)
        offsets = list(prepared.held_bytes)
        done = sum(offsets)

        def sent(size: int) -> None:
            nonlocal done
            done += size
            if progress:
                progress(done, total)

        header = rknn_pb2.UploadHeader(manifest=wire_manifest, start_offsets=offsets)
        paths_in_order = [by_name[f.name] for f in wire_manifest.files]
        stream = upload_requests(header, paths_in_order, upload_chunk_bytes(self.info().limits), sent)
        call = self._channel.stream_unary(  # no serializer: the requests are bytes already
            UPLOAD_METHOD, None, rknn_pb2.UploadModelResponse.FromString
        )
        reply = call(stream, metadata=self.metadata, timeout=self.timeout_s)
        return UploadResult(reply.digest, reply.received_bytes, cached=False)

    def load(
        self,
        model: Path | str,
        *,
        target: str = "",
        perf_debug: bool = False,
        eval_mem: bool = False,
        core_mask: int = 0,
        fallback_prior_device: str = "cpu",
        progress: Progress | None = None,
        reconnect: bool = False,
        on_reconnect: Callable[[str], None] | None = None,
        native_outputs: bool | None = None,
    ) -> Session:
        """Upload (if needed) and open a session on a model.

        With `reconnect=True`, a session lost because the daemon restarted is opened again once,
        transparently (the model is re-sent only if the daemon's cache lost it); `on_reconnect`
        hears about it. Without it the call raises SessionLost.
        `native_outputs` (default: on, unless RKNN_NATIVE_OUTPUTS=0): quantized outputs travel as
        the runtime's integers and are dequantized here, the same float32 values in a quarter of
        the bytes for int8; off, the daemon dequantizes and sends float32.
        """
        self.info()
        uploaded = self.upload(model, progress)
        init = functools.partial(
            self._init_runtime,
            target=target,
            perf_debug=perf_debug,
            eval_mem=eval_mem,
            core_mask=core_mask,
            fallback_prior_device=fallback_prior_device,
        )

        def reopen() -> tuple[rknn_pb2.InitRuntimeResponse, int]:
            again = self.upload(model)
            return init(again.digest), again.sent_bytes

        reply = init(uploaded.digest)
        return Session(self, reply, reopen if reconnect else None, on_reconnect, native_outputs)

    def open_session(
        self,
        digest: str,
        *,
        target: str = "",
        perf_debug: bool = False,
        eval_mem: bool = False,
        core_mask: int = 0,
        fallback_prior_device: str = "cpu",
        native_outputs: bool | None = None,
    ) -> Session:
        return Session(
            self,
            self._init_runtime(
                digest,
                target=target,
                perf_debug=perf_debug,
                eval_mem=eval_mem,
                core_mask=core_mask,
                fallback_prior_device=fallback_prior_device,
            ),
            native_outputs=native_outputs,
        )

    def _init_runtime(
        self,
        digest: str,
        *,
        target: str,
        perf_debug: bool,
        eval_mem: bool,
        core_mask: int,
        fallback_prior_device: str,
    ) -> rknn_pb2.InitRuntimeResponse:
        return self._call(
            "InitRuntime",
            self._stub.InitRuntime,
            rknn_pb2.InitRuntimeRequest(
                model_digest=digest,
                target=target.lower(),
                perf_debug=perf_debug,
                eval_mem=eval_mem,
                core_mask=core_mask,
                fallback_prior_device=fallback_prior_device,
            ),
        )

    def close(self) -> None:
        self._channel.close()
        self.endpoint.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """A model loaded on the daemon. Calls renew its lease; `release()` frees it at once."""

    def __init__(
        self,
        device: Device,
        reply: rknn_pb2.InitRuntimeResponse,
        reopen: Reopen | None = None,
        on_reconnect: Callable[[str], None] | None = None,
        native_outputs: bool | None = None,
    ) -> None:
        self.device = device
        self.native_outputs = native_outputs_default() if native_outputs is None else native_outputs
        self.last_run_time_us = 0
        self._released = False
        self._reopen = reopen
        self._reconnect_allowed = True
        self._on_reconnect = on_reconnect
        self._adopt(reply)

    def _adopt(self, reply: rknn_pb2.InitRuntimeResponse) -> None:
        self.id = reply.session_id
        self.inputs = [TensorInfo.from_wire(a) for a in reply.inputs]
        self.outputs = [TensorInfo.from_wire(a) for a in reply.outputs]
        self.runtime_api_version = reply.runtime_api_version
        self.runtime_driver_version = reply.runtime_driver_version
        self._instance = self.device._info.instance_id if self.device._info else ""

    def allow_reconnect(self, allowed: bool) -> None:
        """Turn the re-open after a daemon restart on or off (only for sessions loaded with reconnect=True)."""
        self._reconnect_allowed = allowed

    def _daemon_restarted(self) -> bool:
        """Whether the daemon answering now is another run than the one that opened this session."""
        try:
            now = self.device.info(refresh=True).instance_id
        except RknnError:
            return False
        return bool(self._instance) and now != self._instance

    def _guarded(self, call: Callable[[], T]) -> T:
        """One session call; a session lost to a daemon restart is re-opened once when allowed."""
        try:
            return call()
        except SessionLost as exc:
            if not self._daemon_restarted():
                raise
            if self._reopen is None or not self._reconnect_allowed:
                raise SessionLost(
                    f"daemon restarted, session lost ({self.device.endpoint.description}); load the model "
                    f"again, or pass reconnect=True to Device.load: {exc}"
                ) from None
            reply, sent = self._reopen()
            self._adopt(reply)
            if self._on_reconnect is not None:
                self._on_reconnect(
                    f"the daemon restarted and the session was lost; re-initialized the runtime "
                    f"(model re-sent: {sent} bytes)"
                )
        return call()

    def _check(self, arrays: Sequence[np.ndarray], strict: bool) -> None:
        if len(arrays) != len(self.inputs):
            raise InvalidInput(f"the model has {len(self.inputs)} input(s); {len(arrays)} were given")
        if not strict:
            return
        for spec, array in zip(self.inputs, arrays, strict=True):
            if not isinstance(array, np.ndarray):
                raise InvalidInput(
                    f"input {spec.index} ({spec.name}) is {type(array).__name__}; expected ndarray"
                )
            if array.dtype != spec.dtype:
                raise InvalidInput(
                    f"input {spec.index} ({spec.name}) is {array.dtype}; the model expects {spec.dtype}"
                )
            if len(array.shape) != len(spec.shape) or any(
                e > 0 and e != a for e, a in zip(spec.shape, array.shape, strict=True)
            ):
                raise InvalidInput(
                    f"input {spec.index} ({spec.name}) has shape {list(array.shape)}; "
                    f"the model expects {list(spec.shape)} ({spec.layout})"
                )

    def run(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None = None,
        *,
        pass_through: Sequence[bool] | None = None,
        strict: bool = True,
        progress: Progress | None = None,
    ) -> list[np.ndarray]:
        """Run once. `layouts` says how 4-D inputs are laid out when not in the model's own layout;
        `strict=False` leaves shape and dtype checks to the daemon (which converts layouts).
        `progress` hears (bytes moved, bytes to move) of a frame too big for one message: inputs sent,
        then outputs received (the total grows by the outputs' size once the daemon names it)."""
        return self._guarded(lambda: self._run_once(inputs, layouts, pass_through, strict, progress))

    def _run_once(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None,
        pass_through: Sequence[bool] | None,
        strict: bool,
        progress: Progress | None = None,
    ) -> list[np.ndarray]:
        header, wire = self._frame(inputs, layouts, pass_through, strict, frame_id=0)
        if self._fits_one_message(wire):
            return self._run_unary(header, wire)
        where = f"Inference on {self.device.endpoint.description}"
        moved, total = 0, sum(a.nbytes for a in wire)

        def count(size: int) -> None:
            nonlocal moved
            moved += size
            if progress:
                progress(moved, total)

        def sent(requests: Iterator[rknn_pb2.InferenceRequest]) -> Iterator[rknn_pb2.InferenceRequest]:
            for request in requests:
                yield request
                count(len(request.chunk.data))

        try:
            responses = cast(
                Iterator[rknn_pb2.InferenceResponse],
                self.device._stub.Inference(
                    sent(_messages(header, wire)),
                    metadata=self.device.metadata,
                    timeout=self.device.timeout_s,
                ),
            )
            first = next(responses)
            if first.WhichOneof("part") != "header":
                raise RknnError(f"{where}: the daemon sent a chunk before the outputs header")
            self.last_run_time_us = first.header.run_time_us
            total += sum(meta.byte_length for meta in first.header.outputs)
            assembler = self.new_output_assembler(first.header)
            for response in responses:
                assembler.add(response.chunk)
                count(len(response.chunk.data))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, where) from None
        except StopIteration:
            raise RknnError(f"{where}: the daemon closed the stream without outputs") from None
        return self.real_outputs(assembler.arrays())

    def frame_requests(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None = None,
        *,
        pass_through: Sequence[bool] | None = None,
        strict: bool = True,
        frame_id: int = 0,
    ) -> Iterator[rknn_pb2.InferenceRequest]:
        """One frame's request messages: the header now (inputs are checked here), chunks lazily."""
        return _messages(*self._frame(inputs, layouts, pass_through, strict, frame_id))

    def _frame(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None,
        pass_through: Sequence[bool] | None,
        strict: bool,
        frame_id: int,
    ) -> tuple[rknn_pb2.InferenceHeader, list[np.ndarray]]:
        """A checked frame: its header and its wire-ready input arrays."""
        self._check(inputs, strict)
        wire = [codec.wire_array(a) for a in inputs]
        layout_names = list(layouts) if layouts is not None else [s.layout for s in self.inputs]
        through = list(pass_through) if pass_through is not None else [False] * len(wire)
        metas = [
            codec.meta_of(a, spec.name, layout, p)
            for a, spec, layout, p in zip(wire, self.inputs, layout_names, through, strict=True)
        ]
        header = rknn_pb2.InferenceHeader(
            session_id=self.id, inputs=metas, frame_id=frame_id, native_outputs=self.native_outputs
        )
        return header, wire

    def _fits_one_message(self, wire: Sequence[np.ndarray]) -> bool:
        """Whether a frame goes as one unary Run: a daemon that has it, small inputs, and outputs of
        known, small size (counted as float32 at least, the size a dequantized output has)."""
        if self.device.info().protocol_version < RUN_RPC_VERSION or any(s.is_dynamic for s in self.outputs):
            return False
        out_bytes = sum(math.prod(s.shape) * max(s.dtype.itemsize, 4) for s in self.outputs)
        return (
            sum(a.nbytes for a in wire) < codec.SMALL_TRANSFER_BYTES
            and out_bytes < codec.SMALL_TRANSFER_BYTES
        )

    def _run_unary(self, header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray]) -> list[np.ndarray]:
        where = f"Run on {self.device.endpoint.description}"
        request = rknn_pb2.RunRequest(header=header, inputs=[a.tobytes() for a in wire])
        reply = self.device._call("Run", self.device._stub.Run, request)
        self.last_run_time_us = reply.header.run_time_us
        assembler = self.new_output_assembler(reply.header)
        outputs = reply.outputs
        if len(outputs) != len(reply.header.outputs):
            raise RknnError(
                f"{where}: {len(outputs)} output byte strings for {len(reply.header.outputs)} outputs"
            )
        for i, data in enumerate(outputs):
            assembler.add_bytes(i, 0, data)
        return self.real_outputs(assembler.arrays())

    def new_output_assembler(self, header: rknn_pb2.OutputsHeader) -> codec.TensorAssembler:
        return codec.TensorAssembler(header.outputs, _OUTPUT_LIMITS, "output")

    def real_outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Received outputs as float32 where they came as quantized integers (native outputs)."""
        return [spec.real_values(a) for spec, a in zip(self.outputs, arrays, strict=True)]

    def pipeline(self, depth: int = DEFAULT_DEPTH) -> Pipeline:
        """An InferencePipeline stream on this session: submit() frames, result() them in order."""
        return Pipeline(self, depth)

    def map(
        self,
        inputs: Iterable[Sequence[np.ndarray]],
        depth: int = DEFAULT_DEPTH,
        layouts: Sequence[str] | None = None,
    ) -> Iterator[list[np.ndarray]]:
        """Outputs of each input list, in order, with up to `depth` frames in flight so transfers
        overlap the daemon's compute. Inputs are pulled lazily; closing the generator early
        cancels the frames still in flight (the session stays usable)."""
        return ordered_map(self.pipeline(depth), inputs, layouts)

    def dump_layers(
        self, inputs: Sequence[np.ndarray], layouts: Sequence[str] | None = None
    ) -> Iterator[DumpedLayer]:
        """Run once with per-layer capture and yield every captured tensor, one layer at a time
        (only one layer's bytes are held here at once). Stopping early cancels the call. With
        `layouts`, 4-D inputs may be in another layout than the model's (the daemon converts them)."""
        requests = self.frame_requests(inputs, layouts, strict=layouts is None)
        where = f"DumpLayers on {self.device.endpoint.description}"
        call = self.device._stub.DumpLayers(
            requests, metadata=self.device.metadata, timeout=self.device.timeout_s
        )
        header: rknn_pb2.LayerDumpHeader | None = None
        assembler: codec.TensorAssembler | None = None
        try:
            for response in cast(Iterator[rknn_pb2.DumpLayersResponse], call):
                if response.WhichOneof("part") == "layer":
                    if header is not None and assembler is not None:
                        yield _dumped(header, assembler)
                    header = response.layer
                    assembler = codec.TensorAssembler([header.tensor], _OUTPUT_LIMITS, "layer")
                elif assembler is None:
                    raise RknnError(f"{where}: the daemon sent tensor bytes before a layer header")
                else:
                    assembler.add(response.chunk)
            if header is not None and assembler is not None:
                yield _dumped(header, assembler)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, where) from None
        finally:
            call.cancel()

    def perf(self, fix_freq: bool = True) -> PerfReport:
        reply = self._guarded(
            lambda: self.device._call(
                "EvalPerf",
                self.device._stub.EvalPerf,
                rknn_pb2.EvalPerfRequest(session_id=self.id, fix_freq=fix_freq),
            )
        )
        return PerfReport(
            layers=tuple(
                LayerRow(
                    index=r.index,
                    op_type=r.op_type,
                    data_type=r.data_type,
                    target=r.target,
                    input_shapes=tuple(r.input_shapes),
                    output_shape=r.output_shape,
                    time_us=r.time_us,
                    name=r.name,
                    extra=dict(r.extra),
                )
                for r in reply.layers
            ),
            total_time_us=reply.total_time_us,
            total_operator_time_us=reply.total_operator_time_us,
            total_rw_kb=reply.total_rw_kb,
            frequencies={f.kind: tuple(f.values) for f in reply.frequencies},
            frequencies_fixed=reply.frequencies_fixed,
            frequency_note=reply.frequency_note,
            raw_text=reply.raw_text,
            extra_columns=tuple(reply.extra_columns),
        )

    def memory(self) -> MemoryReport:
        reply = self._guarded(
            lambda: self.device._call(
                "EvalMemory", self.device._stub.EvalMemory, rknn_pb2.EvalMemoryRequest(session_id=self.id)
            )
        )
        return MemoryReport(
            weight_memory=reply.weight_memory,
            internal_memory=reply.internal_memory,
            other_memory=reply.other_memory,
            total_memory=reply.total_memory,
            model_size=reply.model_size,
            method=reply.method,
        )

    def keep_alive(self) -> float:
        reply = self._guarded(
            lambda: self.device._call(
                "KeepAlive", self.device._stub.KeepAlive, rknn_pb2.KeepAliveRequest(session_id=self.id)
            )
        )
        return reply.expires_in_s

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.device._call("Release", self.device._stub.Release, rknn_pb2.ReleaseRequest(session_id=self.id))

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _dumped(header: rknn_pb2.LayerDumpHeader, assembler: codec.TensorAssembler) -> DumpedLayer:
    return DumpedLayer(
        index=header.index,
        op_type=header.op_type,
        node_name=header.node_name,
        tensor_name=header.tensor_name,
        array=assembler.arrays()[0],
    )


def _messages(
    header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray]
) -> Iterator[rknn_pb2.InferenceRequest]:
    """A frame's Inference request stream: the header, then its chunks (made lazily)."""
    yield rknn_pb2.InferenceRequest(header=header)
    yield from codec.chunk_requests(wire)


def connect(
    device: str | None = None,
    target: str | None = None,
    timeout_s: float | None = None,
    *,
    token: str | None = None,
    tls_ca: Path | str | None = None,
    tls_cert: Path | str | None = None,
    tls_key: Path | str | None = None,
) -> Device:
    """Reach a daemon: `device` (tcp://HOST:PORT, an adb serial or IP:PORT), else RKNN_SERVER, else the
    single adb board when `target` is set, else a private host-runtime daemon started for this process.
    `token` and the TLS files default to RKNN_SERVER_TOKEN and RKNN_SERVER_TLS_CA/_CERT/_KEY."""
    return Device(
        resolve(device, target), timeout_s, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
    )
