"""The idiomatic client API: `connect()` gives a Device, `Device.load()` a Session (session.py).

    with rknn_client.connect("tcp://board:50515") as device:
        with device.load("model.onnx") as session:
            outputs = session.run([image])

Errors are exceptions (see rknn_client.errors) carrying the daemon's message. This layer is strict:
inputs must have the model's dtype and shape; the RKNN-Toolkit2 conveniences live in rknn_client.compat.
"""

from __future__ import annotations

import platform
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import grpc

from rknn_client import __version__
from rknn_client.digest_cache import DigestCache
from rknn_client.errors import RknnError, VersionMismatch, from_rpc_error
from rknn_client.local import shared_memory
from rknn_client.local.doorbell import Doorbell
from rknn_client.model_files import model_files
from rknn_client.negotiate import check_versions
from rknn_client.reservation import PendingReservation, Reservation
from rknn_client.routes import Progress
from rknn_client.session import Session
from rknn_client.transport.base import Endpoint
from rknn_client.transport.health import SERVING, health_status
from rknn_client.transport.resolve import resolve
from rknn_client.transport.security import Credentials, open_channel
from rknn_client.upload_stream import UPLOAD_METHOD, upload_chunk_bytes, upload_requests
from rknn_proto import framing, manifest, rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import (
    MAX_MESSAGE_BYTES,
    MAX_RUN_REPLY_BYTES,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_METADATA_KEY,
    RESERVATION_METADATA_KEY,
)

T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)
_METADATA = ((PROTOCOL_VERSION_METADATA_KEY, str(PROTOCOL_VERSION)),)
# Concurrent uploads of one model: how often and how long to wait for the other one (about a minute).
_UPLOAD_RETRIES = 600
_UPLOAD_RETRY_S = 0.1
_SERVICE_PATH = f"/{rknn_pb2.DESCRIPTOR.services_by_name['RknnServer'].full_name}"
_RUN_METHOD = f"{_SERVICE_PATH}/Run"
# How long the version handshake (and the health check) may take unless the caller says otherwise.
HANDSHAKE_TIMEOUT_S = 30.0


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
class OpenOptions:
    """How a session opens its model (InitRuntime's options), taken once by `load`/`open_session`
    and kept for the re-open after a daemon restart."""

    target: str = ""
    perf_debug: bool = False
    eval_mem: bool = False
    core_mask: int = 0
    fallback_prior_device: str = "cpu"

    def request(self, digest: str) -> rknn_pb2.InitRuntimeRequest:
        return rknn_pb2.InitRuntimeRequest(
            model_digest=digest,
            target=self.target.lower(),
            perf_debug=self.perf_debug,
            eval_mem=self.eval_mem,
            core_mask=self.core_mask,
            fallback_prior_device=self.fallback_prior_device,
        )


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
        # Run with its messages written and read by framing (made on first use).
        self._run_call: grpc.UnaryUnaryMultiCallable | None = None
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
        return self.frames("InferencePipeline", requests, deadline=False)

    def frames(
        self,
        method: str,
        requests: Iterator[bytes],
        parse: Callable[[bytes], Any] = framing.parse_inference_response,
        *,
        deadline: bool = True,
    ) -> ResponseStream[Any]:
        """A frame stream (Inference, InferencePipeline, DumpLayers) in progress: its requests go as
        framing wrote them, its responses are read by `parse` (framing's: chunks as views of what
        gRPC received); errors arrive while reading, for the reader to map with its own context."""
        self._negotiate()
        if method not in self._frame_streams:
            self._frame_streams[method] = self._channel.stream_stream(
                f"{_SERVICE_PATH}/{method}", request_serializer=None, response_deserializer=parse
            )
        stream = self._frame_streams[method]
        return cast(
            ResponseStream[Any],
            stream(requests, metadata=self.metadata, timeout=self.timeout_s if deadline else None),
        )

    def run(self, request: bytes) -> framing.UnaryFrame[rknn_pb2.OutputsHeader]:
        """One unary Run, its request as framing wrote it (run_request_bytes), its reply as framing
        reads it (the outputs as views of what gRPC received)."""
        if self._run_call is None:
            self._run_call = self._channel.unary_unary(
                _RUN_METHOD, request_serializer=None, response_deserializer=framing.parse_run_response
            )
        return self._call("Run", self._run_call, request)

    # -- A session's calls (session.py) ---------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """The daemon run that answered the last handshake ("" before one)."""
        return self._info.instance_id if self._info else ""

    def eval_perf(self, session_id: str, fix_freq: bool) -> rknn_pb2.EvalPerfResponse:
        request = rknn_pb2.EvalPerfRequest(session_id=session_id, fix_freq=fix_freq)
        return self._call("EvalPerf", self._stub.EvalPerf, request)

    def eval_memory(self, session_id: str) -> rknn_pb2.EvalMemoryResponse:
        return self._call(
            "EvalMemory", self._stub.EvalMemory, rknn_pb2.EvalMemoryRequest(session_id=session_id)
        )

    def keep_alive(self, session_id: str) -> rknn_pb2.KeepAliveResponse:
        return self._call("KeepAlive", self._stub.KeepAlive, rknn_pb2.KeepAliveRequest(session_id=session_id))

    def release_session(self, session_id: str) -> None:
        self._call("Release", self._stub.Release, rknn_pb2.ReleaseRequest(session_id=session_id))

    # -- Shared-memory tensors (client/local/shared_memory.py drives these) ---------------------------

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
        """A doorbell ringing frames of this RunShared header without a call each (client/local/doorbell.py)."""
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
        options = OpenOptions(target, perf_debug, eval_mem, core_mask, fallback_prior_device)
        self.info()
        uploaded = self.upload(model, progress)

        def reopen() -> tuple[rknn_pb2.InitRuntimeResponse, int]:
            again = self.upload(model)
            return self._init_runtime(again.digest, options), again.sent_bytes

        reply = self._init_runtime(uploaded.digest, options)
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
        """A session on a model the daemon holds already (by digest), with `load`'s options."""
        options = OpenOptions(target, perf_debug, eval_mem, core_mask, fallback_prior_device)
        return Session(self, self._init_runtime(digest, options), native_outputs=native_outputs)

    def _init_runtime(self, digest: str, options: OpenOptions) -> rknn_pb2.InitRuntimeResponse:
        return self._call("InitRuntime", self._stub.InitRuntime, options.request(digest))

    def close(self) -> None:
        shared_memory.device_closed(self)
        self._channel.close()
        self.endpoint.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
