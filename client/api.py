"""The idiomatic client API: `connect()` gives a Device, `Device.load()` a Session.

    with rknn_client.connect("tcp://board:50515") as device:
        with device.load("model.onnx") as session:
            outputs = session.run([image])

Errors are exceptions (see rknn_client.errors) carrying the daemon's message. This layer is strict:
inputs must have the model's dtype and shape; the RKNN-Toolkit2 conveniences live in rknn_client.compat.
"""

from __future__ import annotations

import functools
import os
import platform
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import grpc
import numpy as np

from rknn_client import __version__, shared_memory
from rknn_client.digest_cache import DigestCache
from rknn_client.doorbell import Doorbell
from rknn_client.errors import InvalidInput, RknnError, SessionLost, VersionMismatch, from_rpc_error
from rknn_client.model_files import model_files
from rknn_client.negotiate import check_versions
from rknn_client.pipeline import Pipeline, ordered_map
from rknn_client.reservation import PendingReservation, Reservation
from rknn_client.transport.base import Endpoint
from rknn_client.transport.health import SERVING, health_status
from rknn_client.transport.resolve import resolve
from rknn_client.transport.security import Credentials, open_channel
from rknn_client.upload_stream import UPLOAD_METHOD, upload_chunk_bytes, upload_requests
from rknn_proto import codec, convert, framing, manifest, rknn_pb2, rknn_pb2_grpc
from rknn_proto.buffers import BufferPool
from rknn_proto.messages import (
    EvalMemoryResponse,
    EvalPerfResponse,
    LayerDump,
    QuantType,
    reply_bytes_bound,
)
from rknn_proto.version import (
    MAX_MESSAGE_BYTES,
    MAX_RUN_REPLY_BYTES,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_METADATA_KEY,
    RESERVATION_METADATA_KEY,
    RUN_RPC_VERSION,
    UNBOUNDED_RUN_VERSION,
)

T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)
Progress = Callable[[int, int], None]
# Re-opens a lost session on a restarted daemon: the new InitRuntime reply and the model bytes re-sent.
Reopen = Callable[[], tuple[rknn_pb2.InitRuntimeResponse, int]]
_METADATA = ((PROTOCOL_VERSION_METADATA_KEY, str(PROTOCOL_VERSION)),)
# Concurrent uploads of one model: how often and how long to wait for the other one (about a minute).
_UPLOAD_RETRIES = 600
_UPLOAD_RETRY_S = 0.1
# The client trusts its daemon but still bounds what it allocates for outputs.
_OUTPUT_LIMITS = codec.TensorLimits(max_tensor_bytes=16 << 30, max_rank=32, max_tensors=4096)
# Room in a unary Run request for its header beside the inputs' bytes.
_HEADER_ROOM = 64 << 10
_SERVICE_PATH = f"/{rknn_pb2.DESCRIPTOR.services_by_name['RknnServer'].full_name}"
_RUN_METHOD = f"{_SERVICE_PATH}/Run"
# How long the version handshake (and the health check) may take unless the caller says otherwise.
HANDSHAKE_TIMEOUT_S = 30.0
# Set to 0 to have the daemon dequantize quantized outputs instead of sending their native integers.
NATIVE_OUTPUTS_ENV = "RKNN_NATIVE_OUTPUTS"
# Frames kept in flight by Session.map unless told otherwise.
DEFAULT_DEPTH = 4


def native_outputs_default() -> bool:
    """Native (quantized) outputs on the wire unless RKNN_NATIVE_OUTPUTS says 0/false/no/off."""
    return os.environ.get(NATIVE_OUTPUTS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


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
    reserved_by: str = ""  # who holds the board's reservation, "" when nobody does
    reservation_waiters: int = 0  # Reserve calls queued behind the holder


@dataclass(frozen=True)
class UploadResult:
    digest: str
    sent_bytes: int
    cached: bool


class ResponseStream(Protocol[R_co]):
    """A streaming call in progress: its responses in order (errors arrive as grpc.RpcError while
    reading, for the reader to map with its own context), cancellation and an end callback."""

    def __iter__(self) -> Iterator[R_co]: ...

    def __next__(self) -> R_co: ...

    def cancel(self) -> bool: ...

    def add_done_callback(self, callback: Callable[[Any], None]) -> None: ...


class Device:
    """A connection to one daemon: every call the client makes goes through here, with the
    credentials, the protocol version check and the error mapping. Closing it closes the channel and
    undoes the transport (the endpoint is the Device's from construction on)."""

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
        self.shm = shared_memory.DeviceState()  # whether its frames may go through shared memory
        # Sent with every call: the protocol version, plus e.g. a farm reservation token.
        self.metadata = (*_METADATA, *metadata)
        try:
            self._channel = open_channel(
                endpoint,
                Credentials.resolve(endpoint.token or token, tls_ca, tls_cert, tls_key),
                [
                    ("grpc.max_receive_message_length", MAX_RUN_REPLY_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    # A restarted daemon is found again within about a second.
                    ("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
        except BaseException:
            endpoint.close()  # the Device owns the endpoint from the start, even when it fails
            raise
        self._stub = rknn_pb2_grpc.RknnServerStub(self._channel)
        self._frame_streams: dict[str, grpc.StreamStreamMultiCallable] = {}
        self._info: DeviceInfo | None = None

    def _call(self, name: str, fn: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        """Every unary RPC but the handshake: the version check (once per Device), then `_rpc`."""
        self._negotiate(timeout)
        return self._rpc(name, fn, request, timeout)

    def _negotiate(self, timeout: float | None = None) -> None:
        """Raise VersionMismatch (or the handshake's error) unless this daemon's protocol fits."""
        if self._info is None:
            self.info(timeout=timeout or self.timeout_s or HANDSHAKE_TIMEOUT_S)

    def _rpc(self, name: str, fn: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        """One unary call with the credentials (channel and metadata) and the protocol version; a
        failure becomes the typed RknnError naming the call and the daemon."""
        try:
            return fn(request, metadata=self.metadata, timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, f"{name} on {self.endpoint.description}") from None

    def handshake(self, timeout: float = HANDSHAKE_TIMEOUT_S) -> rknn_pb2.GetInfoResponse:
        """GetInfo as the daemon answers it, whatever its protocol version (doctor and devices judge
        that themselves); raises RknnError."""
        return self._rpc(
            "GetInfo",
            self._stub.GetInfo,
            rknn_pb2.GetInfoRequest(
                client_protocol_version=PROTOCOL_VERSION,
                client_version=f"rknn_client {__version__} python {platform.python_version()} {platform.system()}",
            ),
            timeout=timeout,
        )

    def info(self, refresh: bool = False, *, timeout: float = HANDSHAKE_TIMEOUT_S) -> DeviceInfo:
        """The daemon's description; the first call is the version handshake (VersionMismatch when
        the two sides cannot work together)."""
        if self._info is None or refresh:
            reply = self.handshake(timeout)
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
                reserved_by=reply.reservation.holder if reply.HasField("reservation") else "",
                reservation_waiters=reply.reservation_waiters,
            )
        return self._info

    def health(self, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        """Raise unless the daemon's gRPC health check says SERVING (asked without the handshake:
        the daemon answers it to anyone, so it tells a sick daemon from refused credentials)."""
        try:
            status = health_status(self._channel, timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, f"health check on {self.endpoint.description}") from None
        if status != SERVING:
            raise RknnError(f"the daemon at {self.endpoint.description} reports health {status}")

    def reserve(
        self, holder: str, ttl_s: float, *, wait_s: float = 0.0, timeout: float | None = None
    ) -> Reservation:
        """Hold the board for `holder` alone (other clients cannot open sessions), queueing up to
        `wait_s` behind someone else's reservation; FailedPrecondition when it is still held then.
        The reservation lapses after `ttl_s` (clamped by the daemon) unless renewed."""
        request = rknn_pb2.ReserveRequest(holder=holder, ttl_s=ttl_s, wait_s=wait_s)
        return Reservation.from_wire(self._call("Reserve", self._stub.Reserve, request, timeout))

    def queue_reservation(
        self, holder: str, ttl_s: float, wait_s: float, timeout: float | None = None
    ) -> PendingReservation:
        """Like `reserve`, without waiting: the call queues on the daemon and the handle says when it
        is granted, or leaves the queue (the farm queues on several boards and takes the first)."""
        self._negotiate()
        token = secrets.token_urlsafe(24)
        request = rknn_pb2.ReserveRequest(holder=holder, ttl_s=ttl_s, wait_s=wait_s, token=token)
        future = self._stub.Reserve.future(
            request, metadata=self.metadata, timeout=timeout if timeout is not None else self.timeout_s
        )
        return PendingReservation(future, token, f"Reserve on {self.endpoint.description}")

    def renew_reservation(self, token: str, timeout: float | None = None) -> float:
        """Extend the reservation `token` proves; the seconds left. NotFound once it has lapsed."""
        request = rknn_pb2.RenewReservationRequest(token=token)
        return self._call("RenewReservation", self._stub.RenewReservation, request, timeout).expires_in_s

    def release_reservation(self, token: str, timeout: float | None = None) -> None:
        """Give the board back; NotFound when `token` holds nothing (never granted, or lapsed)."""
        request = rknn_pb2.ReleaseReservationRequest(token=token)
        self._call("ReleaseReservation", self._stub.ReleaseReservation, request, timeout)

    def use_reservation(self, token: str) -> None:
        """From now on every call of this Device proves the reservation `token` (a reserved board
        admits only its holder's sessions)."""
        self.metadata = (*self.metadata, (RESERVATION_METADATA_KEY, token))

    def inference_pipeline(self, requests: Iterator[bytes]) -> ResponseStream[framing.StreamResponse]:
        """An InferencePipeline stream fed from serialized `requests` (read by gRPC's own thread), no
        deadline."""
        self._negotiate()
        return self._frame_stream("InferencePipeline")(requests, metadata=self.metadata)

    def _frame_stream(
        self, method: str, parse: Callable[[bytes], Any] = framing.parse_inference_response
    ) -> Callable[..., ResponseStream[Any]]:
        """A frame stream (Inference, InferencePipeline, DumpLayers) whose requests go as framing
        wrote them and whose responses `parse` reads (framing's: chunks as views of what gRPC
        received); made once."""
        if method not in self._frame_streams:
            self._frame_streams[method] = self._channel.stream_stream(
                f"{_SERVICE_PATH}/{method}", request_serializer=None, response_deserializer=parse
            )
        return cast(Callable[..., ResponseStream[Any]], self._frame_streams[method])

    # -- Shared-memory tensors (client/shared_memory.py drives these) ---------------------------

    def register_shared_memory(
        self, request: rknn_pb2.RegisterSharedMemoryRequest
    ) -> rknn_pb2.RegisterSharedMemoryResponse:
        """Hand the daemon a region of this host's shared memory (docs/shared-memory.md)."""
        return self._call("RegisterSharedMemory", self._stub.RegisterSharedMemory, request)

    def unregister_shared_memory(self, key: str) -> int:
        """Close the region registered as `key`; how many the daemon closed (0: it was gone)."""
        request = rknn_pb2.UnregisterSharedMemoryRequest(key=key)
        return self._call("UnregisterSharedMemory", self._stub.UnregisterSharedMemory, request).closed

    def shared_memory_status(self, key: str = "") -> list[rknn_pb2.SharedMemoryRegion]:
        """This client's regions the daemon holds (one, by `key`), each with its use count."""
        request = rknn_pb2.SharedMemoryStatusRequest(key=key)
        return list(self._call("SharedMemoryStatus", self._stub.SharedMemoryStatus, request).regions)

    def run_shared(self, header: rknn_pb2.InferenceHeader) -> rknn_pb2.RunResponse:
        """One frame whose inputs and outputs live in registered regions (the header names them)."""
        return self._call("RunShared", self._stub.RunShared, rknn_pb2.RunRequest(header=header))

    def open_doorbell(self, header: rknn_pb2.InferenceHeader) -> Doorbell:
        """A doorbell ringing frames of this RunShared header without a call each (client/doorbell.py)."""
        reply = self._call(
            "OpenDoorbell", self._stub.OpenDoorbell, rknn_pb2.OpenDoorbellRequest(header=header)
        )
        return Doorbell(reply, f"the doorbell of {self.endpoint.description}")

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
        shared_memory.device_closed(self)
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
        self.shm = shared_memory.SessionState()  # its shared-memory region, once it has one
        self.native_outputs = native_outputs_default() if native_outputs is None else native_outputs
        self.last_run_time_us = 0
        self._released = False
        self._reopen = reopen
        self._reconnect_allowed = True
        self._on_reconnect = on_reconnect
        self._route: int | None = None  # see _decide_route
        # Run with its messages written and read by framing (run_request_bytes, parse_run_response; made
        # on first use).
        self._run_call: grpc.UnaryUnaryMultiCallable | None = None
        # The memory of outputs the caller has dropped takes the next frames' (no fresh pages).
        self._output_buffers = BufferPool()
        self._adopt(reply)

    def _adopt(self, reply: rknn_pb2.InitRuntimeResponse) -> None:
        self.id = reply.session_id
        self.inputs = [convert.tensor_attr_from_wire(a) for a in reply.inputs]
        self.outputs = [convert.tensor_attr_from_wire(a) for a in reply.outputs]
        self.runtime_api_version = reply.runtime_api_version
        self.runtime_driver_version = reply.runtime_driver_version
        self._instance = self.device._info.instance_id if self.device._info else ""
        self._route = None
        self._last_frame: _LastFrame | None = None  # see _frame
        self._quantized = any(s.quant_type is not QuantType.NONE for s in self.outputs)

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
        """What the client can know (docs/architecture.md): the count and, when strict, the types.
        Shapes are the daemon's intake's to check, once."""
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
        `strict=False` leaves the dtype check to the daemon too (shapes are always its to check; it
        converts layouts).
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
        shared = shared_memory.run_frame(self, header, wire, progress)
        if shared is not None:
            return shared
        outputs = self._run_on_wire(header, wire, progress)
        shared_memory.learn_room(self, wire, outputs)
        return outputs

    def _run_on_wire(
        self, header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray], progress: Progress | None
    ) -> list[np.ndarray]:
        """One frame as one unary Run, or as a one-frame Inference stream (_decide_route)."""
        sent = sum([a.nbytes for a in wire])
        if self._goes_unary(sent):
            return self._run_unary(header, wire)
        where = f"Inference on {self.device.endpoint.description}"
        total = sent

        def outputs_named(head: rknn_pb2.OutputsHeader) -> OutputFrame:
            nonlocal total
            total += sum(meta.byte_length for meta in head.outputs)
            return self.new_output_assembler(head)

        reader: framing.FrameReader[rknn_pb2.OutputsHeader, OutputFrame] = framing.FrameReader(
            outputs_named, describe_header="OutputsHeader"
        )
        requests = framing.frame_bytes(
            _serialized_header(header), wire, (lambda moved: progress(moved, total)) if progress else None
        )
        try:
            responses: Iterator[framing.StreamResponse] = self.device._frame_stream("Inference")(
                requests, metadata=self.device.metadata, timeout=self.device.timeout_s
            )
            if progress:
                responses = _after_each(responses, lambda: progress(sent + reader.bytes, total))
            frames = framing.read_frames(responses, reader)
            frame = next(frames, None)
            # Read on to the end of the stream: the call ends OK on both sides (a stream left unread
            # is cancelled, and the daemon would record a frame it answered as CANCELLED).
            if frame is not None and next(frames, None) is not None:
                raise RknnError(f"{where}: the daemon answered one frame with two")
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, where) from None
        except framing.FrameError as exc:
            raise RknnError(f"{where}: {exc}") from None
        if frame is None:
            raise RknnError(f"{where}: the daemon closed the stream without outputs")
        if progress:  # the frame is whole before the reporter hears of its last chunk
            progress(sent + reader.bytes, total)
        self.last_run_time_us = frame.header.run_time_us
        return self.real_outputs(frame.arrays())

    def frame_bytes(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None = None,
        *,
        pass_through: Sequence[bool] | None = None,
        strict: bool = True,
        frame_id: int = 0,
    ) -> Iterator[bytes]:
        """One frame's request messages, serialized (framing.frame_bytes: one copy of each chunk's
        bytes): the header now (inputs are checked here), chunks lazily."""
        header, wire = self._frame(inputs, layouts, pass_through, strict, frame_id)
        return framing.frame_bytes(_serialized_header(header), wire)

    def _frame(
        self,
        inputs: Sequence[np.ndarray],
        layouts: Sequence[str] | None,
        pass_through: Sequence[bool] | None,
        strict: bool,
        frame_id: int,
    ) -> tuple[rknn_pb2.InferenceHeader, list[np.ndarray]]:
        """A checked frame: its header and its wire-ready input arrays. A frame like the last one
        (inputs of the same types, shapes and memory order, the same options) was checked already:
        it gets the same header (the very object, for run()'s frame id 0) and travels as given."""
        signature = _signature(inputs, layouts, pass_through, strict, self.native_outputs)
        last = self._last_frame
        if last is not None and last.signature == signature:
            wire = list(inputs)
            if frame_id == 0:
                return last.header, wire
            return self._header(last.header.inputs, frame_id), wire
        self._check(inputs, strict)
        wire = [codec.wire_array(a) for a in inputs]
        layout_names = list(layouts) if layouts is not None else [s.layout for s in self.inputs]
        through = list(pass_through) if pass_through is not None else [False] * len(wire)
        metas = [
            codec.meta_of(a, spec.name, layout, p)
            for a, spec, layout, p in zip(wire, self.inputs, layout_names, through, strict=True)
        ]
        header = self._header(metas, frame_id)
        if signature is not None and all(w is a for w, a in zip(wire, inputs, strict=True)):
            self._last_frame = _LastFrame(signature, header if frame_id == 0 else self._header(metas, 0))
        return header, wire

    def _header(self, metas: Sequence[rknn_pb2.TensorMeta], frame_id: int) -> rknn_pb2.InferenceHeader:
        return rknn_pb2.InferenceHeader(
            session_id=self.id, inputs=metas, frame_id=frame_id, native_outputs=self.native_outputs
        )

    def _goes_unary(self, input_bytes: int) -> bool:
        """Whether a frame of `input_bytes` goes as one unary Run, from the route decided once."""
        if self._route is None:
            self._route = self._decide_route()
        return input_bytes <= self._route

    def _decide_route(self) -> int:
        """The most input bytes a frame may have to go as one unary Run (-1: never), decided once per
        session from what the daemon said: its protocol (Run; replies of any size), its message limit
        (GetInfo) and the outputs' sizes (InitRuntime). Unary is the faster path for small transfers,
        the stream for large ones (codec.SMALL_TRANSFER_BYTES). Outputs of unknown size go unary when
        the daemon answers a Run whatever its outputs come to (so it never computes and then refuses
        them); outputs known to be large go by the stream."""
        info = self.device.info()
        if info.protocol_version < RUN_RPC_VERSION:
            return -1
        message_limit = int(info.limits.get("max_message_bytes") or MAX_MESSAGE_BYTES)
        bound = reply_bytes_bound(self.outputs, self.native_outputs)
        if info.protocol_version < UNBOUNDED_RUN_VERSION and (bound is None or bound > message_limit // 2):
            return -1  # an older daemon's Run refuses, after computing, outputs over half its limit
        if bound is not None and bound >= codec.SMALL_TRANSFER_BYTES:
            return -1
        return min(codec.SMALL_TRANSFER_BYTES - 1, message_limit - _HEADER_ROOM)

    def _run_unary(self, header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray]) -> list[np.ndarray]:
        where = f"Run on {self.device.endpoint.description}"
        if self._run_call is None:
            self._run_call = self.device._channel.unary_unary(
                _RUN_METHOD, request_serializer=None, response_deserializer=framing.parse_run_response
            )
        reply = self.device._call("Run", self._run_call, framing.run_request_bytes(header, wire))
        self.last_run_time_us = reply.header.run_time_us
        try:
            frame = framing.whole_frame(
                self.new_output_assembler(reply.header), reply.tensors, len(reply.header.outputs), "output"
            )
        except framing.FrameError as exc:
            raise RknnError(f"{where}: {exc}") from None
        return self.real_outputs(frame.arrays())

    def new_output_assembler(self, header: rknn_pb2.OutputsHeader) -> OutputFrame:
        return OutputFrame(header, self._output_buffers)

    def real_outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Received outputs as float32 where they came as quantized integers (native outputs)."""
        if not self._quantized:  # nothing to dequantize: every frame's outputs, as they came
            return arrays
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
    ) -> Iterator[LayerDump]:
        """Run once with per-layer capture and yield every captured tensor, one layer at a time
        (only one layer's bytes are held here at once). Stopping early cancels the call. With
        `layouts`, 4-D inputs may be in another layout than the model's (the daemon converts them)."""
        requests = self.frame_bytes(inputs, layouts, strict=layouts is None)
        where = f"DumpLayers on {self.device.endpoint.description}"
        call: ResponseStream[rknn_pb2.DumpLayersResponse] = self.device._frame_stream(
            "DumpLayers", rknn_pb2.DumpLayersResponse.FromString
        )(requests, metadata=self.device.metadata, timeout=self.device.timeout_s)
        reader: framing.FrameReader[rknn_pb2.LayerDumpHeader, LayerFrame] = framing.FrameReader(
            LayerFrame, header="layer", what="layer", describe_header="LayerDumpHeader"
        )
        try:
            for layer in framing.read_frames(call, reader):
                yield layer.dumped()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, where) from None
        except framing.FrameError as exc:
            raise RknnError(f"{where}: {exc}") from None
        finally:
            call.cancel()

    def perf(self, fix_freq: bool = True) -> EvalPerfResponse:
        reply = self._guarded(
            lambda: self.device._call(
                "EvalPerf",
                self.device._stub.EvalPerf,
                rknn_pb2.EvalPerfRequest(session_id=self.id, fix_freq=fix_freq),
            )
        )
        return convert.perf_from_wire(reply)

    def memory(self) -> EvalMemoryResponse:
        reply = self._guarded(
            lambda: self.device._call(
                "EvalMemory", self.device._stub.EvalMemory, rknn_pb2.EvalMemoryRequest(session_id=self.id)
            )
        )
        return convert.memory_from_wire(reply)

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


class OutputFrame(codec.TensorAssembler):
    """One frame's outputs being received: the daemon's header and the outputs' bytes (in `buffers`)."""

    def __init__(self, header: rknn_pb2.OutputsHeader, buffers: BufferPool) -> None:
        super().__init__(header.outputs, _OUTPUT_LIMITS, "output", buffers.take)
        self.header = header


class LayerFrame(codec.TensorAssembler):
    """One dumped layer being received: its header and its tensor's bytes."""

    def __init__(self, header: rknn_pb2.LayerDumpHeader) -> None:
        super().__init__([header.tensor], _OUTPUT_LIMITS, "layer")
        self.header = header

    def dumped(self) -> LayerDump:
        return convert.layer_dump_from_wire(self.header, self.arrays()[0])


@dataclass(frozen=True)
class _LastFrame:
    """The last checked frame's signature (see _signature) and its header for frame id 0."""

    signature: tuple[object, ...]
    header: rknn_pb2.InferenceHeader


def _signature(
    inputs: Sequence[np.ndarray],
    layouts: Sequence[str] | None,
    pass_through: Sequence[bool] | None,
    strict: bool,
    native_outputs: bool,
) -> tuple[object, ...] | None:
    """All that a frame's checks and header depend on: each input's dtype (with its byte order),
    shape and whether it is C-contiguous, and the frame's options. None for inputs that are not plain
    ndarrays (checked, and described, afresh every time)."""
    if not all([type(a) is np.ndarray for a in inputs]):
        return None
    shapes = tuple([(a.dtype, a.shape, a.flags.c_contiguous) for a in inputs])
    return (
        shapes,
        None if layouts is None else tuple(layouts),
        None if pass_through is None else tuple(pass_through),
        strict,
        native_outputs,
    )


def _serialized_header(header: rknn_pb2.InferenceHeader) -> bytes:
    """A frame's first request message, serialized."""
    return rknn_pb2.InferenceRequest(header=header).SerializeToString()


def _after_each(messages: Iterable[T], then: Callable[[], object]) -> Iterator[T]:
    """`messages`, calling `then` after each one has been taken (for a progress display)."""
    for message in messages:
        yield message
        then()


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
