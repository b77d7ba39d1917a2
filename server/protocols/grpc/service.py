"""The gRPC handlers: translate protobuf to plain requests, await the data plane, translate back.

Sessions, the model cache, the executor and runs live in the data plane (data_plane.py), which
knows no protocol; the frame intake (frames.py) checks tensors once. The interceptor (guard.py)
checks the caller and its protocol version, records each RPC (metrics, one log event) and turns
exceptions into a gRPC status, so a handler only raises, and reports the session and the bytes of
its call on `current_call()`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TypeVar

import grpc

from rknn_proto import codec, convert, framing, rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import CHUNK_BYTES, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, RESERVATION_METADATA_KEY
from rknn_server import __version__
from rknn_server.config.limits import Limits
from rknn_server.core.data_plane import DataPlane, OpenRequest
from rknn_server.core.frames import check_chunk
from rknn_server.core.sessions import Session
from rknn_server.core.shm import SharedMemoryRegistry, ShmLimits
from rknn_server.errors import FailedPrecondition, InvalidInput
from rknn_server.kit.guard import Codecs, client_identity, current_call, serialized
from rknn_server.observe.calls import Call
from rknn_server.protocols.grpc.pipeline import Pipeline
from rknn_server.protocols.grpc.upload_wire import Chunk, parse_upload_request, upload_chunk
from rknn_server.protocols.local.doorbell import TICKET_TTL_S, Doorbells
from rknn_server.protocols.local.shm_run import prepare, run_shared
from rknn_server.store.reservations import ReservationBook
from rknn_server.store.uploads import Part, receive

T = TypeVar("T")

# Core masks the contract defines (rknn_core_mask values).
KNOWN_CORE_MASKS = {v.number for v in rknn_pb2.CoreMask.DESCRIPTOR.values}


def wire_limits(limits: Limits) -> rknn_pb2.Limits:
    """GetInfo's `Limits`: every field of `Limits` under its own name, plus the chunk size the daemon sends."""
    return rknn_pb2.Limits(chunk_bytes=CHUNK_BYTES, **asdict(limits))


@dataclass(frozen=True)
class ServiceConfig:
    """What GetInfo says of this daemon besides its limits."""

    runtime_reason: str = ""
    board: str = ""
    # Security posture.
    auth_required: bool = False
    tls: bool = False
    insecure: bool = False
    warnings: tuple[str, ...] = ()
    instance_id: str = ""


_SERVICE_PATH = f"/{rknn_pb2.DESCRIPTOR.services_by_name['RknnServer'].full_name}"
# The methods whose handlers take and give wire bytes rather than protobuf objects (the guard
# registers them so): Run's inputs are read in place and its outputs written once, where protobuf
# would copy each twice each way; the frame streams' chunks are read as views and written with one
# copy; an upload's chunk data is not copied at all. Method path -> (request deserializer,
# response serializer).
CODECS: Mapping[str, Codecs] = MappingProxyType(
    {
        f"{_SERVICE_PATH}/Run": (framing.parse_run_request, serialized),
        f"{_SERVICE_PATH}/Inference": (framing.parse_inference_request, serialized),
        f"{_SERVICE_PATH}/InferencePipeline": (framing.parse_inference_request, serialized),
        f"{_SERVICE_PATH}/DumpLayers": (
            framing.parse_inference_request,
            rknn_pb2.DumpLayersResponse.SerializeToString,
        ),
        # An upload's chunks are read as views of what gRPC received (rknn_server.protocols.grpc.upload_wire).
        f"{_SERVICE_PATH}/UploadModel": (
            parse_upload_request,
            rknn_pb2.UploadModelResponse.SerializeToString,
        ),
    }
)


_Frames = Callable[[Pipeline, AsyncIterator[framing.StreamRequest], Call], AsyncGenerator[bytes, None]]
# A servicer method (self, request_iterator, context); `...`: the generated base types its arguments
# more loosely than the handler takes them.
_FrameHandler = Callable[..., AsyncGenerator[bytes, None]]


def _frame_stream(frames: _Frames) -> _FrameHandler:
    """The handler of a frame-moving streaming RPC: `frames` (a Pipeline method) over the service's
    pipeline, the bytes it moves in the call's record."""

    async def handler(
        self: RknnService,
        request_iterator: AsyncIterator[framing.StreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[bytes, None]:
        async with aclosing(frames(self.pipeline, request_iterator, current_call())) as responses:
            async for response in responses:
                yield response

    return handler


class RknnService(rknn_pb2_grpc.RknnServerServicer):
    def __init__(
        self,
        plane: DataPlane,
        reservations: ReservationBook,
        config: ServiceConfig,
        limits: Limits,
        shared: SharedMemoryRegistry | None = None,
        doorbells: Doorbells | None = None,
    ) -> None:
        self.plane = plane
        self.reservations = reservations
        self.config = config
        self.limits = limits
        self.pipeline = Pipeline(plane)
        self.shared = shared if shared is not None else SharedMemoryRegistry(ShmLimits(enabled=False), 0.0)
        self.doorbells = doorbells

    # -- GetInfo -----------------------------------------------------------------------------

    async def GetInfo(
        self, request: rknn_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.GetInfoResponse:
        backend = self.plane.backend
        caps = backend.capabilities
        version = backend.version()
        held = self.reservations.current
        return rknn_pb2.GetInfoResponse(
            daemon_version=__version__,
            protocol_version=PROTOCOL_VERSION,
            min_client_protocol_version=MIN_PROTOCOL_VERSION,
            runtime=backend.name,
            runtime_version=version.api,
            soc=backend.soc(),
            driver_version=version.driver,
            capabilities=rknn_pb2.Capabilities(
                perf_per_layer=caps.perf_per_layer,
                memory_detail=caps.memory_detail,
                layer_dumps=caps.layer_dumps,
                core_mask=caps.core_mask,
                dynamic_shape=caps.dynamic_shape,
                fix_freq=caps.fix_freq,
            ),
            limits=wire_limits(self.limits),
            runtime_reason=self.config.runtime_reason,
            model_formats=list(backend.model_suffixes),
            board=self.config.board,
            open_sessions=len(self.plane.registry),
            insecure=self.config.insecure,
            auth_required=self.config.auth_required,
            client_identity=client_identity(),
            instance_id=self.config.instance_id,
            warnings=list(self.config.warnings),
            tls=self.config.tls,
            reservation=None
            if held is None
            else rknn_pb2.ReservationInfo(
                holder=held.holder, since_unix_s=held.since_unix_s, expires_in_s=held.expires_in()
            ),
            reservation_waiters=self.reservations.waiting,
            shared_memory=self._shared_memory_info(context),
        )

    # -- Model transfer ----------------------------------------------------------------------

    async def PrepareUpload(
        self, request: rknn_pb2.PrepareUploadRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.PrepareUploadResponse:
        # Cached and held bytes are the caller's own: to others a model is not there (model_cache.py).
        cached, held = await self.plane.blocking(
            self.plane.cache.prepare, request.manifest, client_identity()
        )
        return rknn_pb2.PrepareUploadResponse(cached=cached, held_bytes=held)

    async def UploadModel(
        self, request_iterator: AsyncIterator[rknn_pb2.UploadModelRequest], context: grpc.aio.ServicerContext
    ) -> rknn_pb2.UploadModelResponse:
        call = current_call()
        first = await _first(request_iterator, "an UploadHeader")
        if isinstance(first, Chunk) or first.WhichOneof("part") != "header":
            raise InvalidInput("the first UploadModel message must be an UploadHeader")
        header = first.header
        owner = client_identity()
        async with aclosing(self._upload_parts(request_iterator, call)) as parts:
            upload = await receive(
                lambda: self.plane.cache.begin_upload(header.manifest, list(header.start_offsets), owner),
                self.plane.executor,
                parts,
            )
        return rknn_pb2.UploadModelResponse(
            digest=header.manifest.digest, received_bytes=upload.received_bytes
        )

    async def _upload_parts(
        self, messages: AsyncIterator[rknn_pb2.UploadModelRequest], call: Call
    ) -> AsyncGenerator[Part, None]:
        """The chunks after an UploadModel's header, each checked against the chunk limit (closed by
        the handler whenever the upload ends, so the request stream is let go at once)."""
        async for message in messages:
            chunk = upload_chunk(message)
            if chunk is None:
                raise InvalidInput("after the header, UploadModel takes only UploadChunk messages")
            check_chunk(len(chunk.data), self.plane.tensor_limits)
            call.bytes_in += len(chunk.data)
            yield chunk

    # -- Sessions ----------------------------------------------------------------------------

    async def InitRuntime(
        self, request: rknn_pb2.InitRuntimeRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.InitRuntimeResponse:
        if request.core_mask not in KNOWN_CORE_MASKS:
            raise InvalidInput(
                f"core_mask {request.core_mask:#x} is not an NPU core mask; expected one of "
                f"{', '.join(hex(m) for m in sorted(KNOWN_CORE_MASKS))}"
            )
        session = await self.plane.open(
            OpenRequest(
                digest=request.model_digest,
                owner=client_identity(),
                reservation=dict(context.invocation_metadata() or ()).get(RESERVATION_METADATA_KEY),
                target=request.target,
                perf_debug=request.perf_debug,
                eval_mem=request.eval_mem,
                core_mask=request.core_mask,
                fallback_prior_device=request.fallback_prior_device or "cpu",
            )
        )
        current_call().session = session.id
        runtime = session.runtime
        version = await self.plane.version(session)
        return rknn_pb2.InitRuntimeResponse(
            session_id=session.id,
            inputs=[convert.tensor_attr_to_wire(a) for a in runtime.inputs],
            outputs=[convert.tensor_attr_to_wire(a) for a in runtime.outputs],
            runtime_api_version=version.api,
            runtime_driver_version=version.driver,
        )

    # The frame-moving streams: one frame in series (Inference), frames in flight (InferencePipeline);
    # their messages are read and written by framing (CODECS).
    Inference = _frame_stream(Pipeline.one)  # type: ignore[assignment]
    InferencePipeline = _frame_stream(Pipeline.stream)  # type: ignore[assignment]

    async def Run(  # type: ignore[override]  # its messages are read and written by framing (CODECS)
        self, request: framing.UnaryFrame[rknn_pb2.InferenceHeader], context: grpc.aio.ServicerContext
    ) -> bytes:
        done = await self.pipeline.unary(request.header, framing.in_place(request.tensors), current_call())
        return framing.run_response_bytes(done.header, done.wire)

    async def DumpLayers(  # its requests are read by framing (CODECS)
        self, request_iterator: AsyncIterator[framing.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.DumpLayersResponse]:
        call = current_call()
        frame = await self.pipeline.receive_one(request_iterator, call, "DumpLayers")
        async with aclosing(self.plane.layers(frame.session, frame.inputs(), frame.formats())) as layers:
            async for layer in layers:
                wire = codec.wire_array(layer.array)
                head = convert.layer_dump_to_wire(layer, wire)
                for message in framing.frame_messages(rknn_pb2.DumpLayersResponse, head, [wire], "layer"):
                    yield message
                call.bytes_out += wire.nbytes

    async def EvalPerf(
        self, request: rknn_pb2.EvalPerfRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalPerfResponse:
        session = self._session(request.session_id)
        return convert.perf_to_wire(await self.plane.perf(session, request.fix_freq))

    async def EvalMemory(
        self, request: rknn_pb2.EvalMemoryRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalMemoryResponse:
        return convert.memory_to_wire(await self.plane.memory_of(self._session(request.session_id)))

    async def Release(
        self, request: rknn_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.ReleaseResponse:
        session = await self.plane.close(request.session_id, client_identity())
        current_call().session = session.id
        return rknn_pb2.ReleaseResponse()

    async def KeepAlive(
        self, request: rknn_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.KeepAliveResponse:
        session = self._session(request.session_id, usable=False)
        return rknn_pb2.KeepAliveResponse(expires_in_s=session.expires_in())

    def _session(self, session_id: str, usable: bool = True) -> Session:
        """The caller's session, named in its call's record."""
        session = self.plane.session(session_id, client_identity(), usable)
        current_call().session = session.id
        return session

    # -- Reservations (server/store/reservations.py) -----------------------------------------------

    async def Reserve(
        self, request: rknn_pb2.ReserveRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.ReserveResponse:
        granted = await self.reservations.reserve(
            request.holder, request.ttl_s, request.token, request.wait_s
        )
        return rknn_pb2.ReserveResponse(token=granted.token, ttl_s=granted.ttl_s, waited_s=granted.waited_s)

    async def RenewReservation(
        self, request: rknn_pb2.RenewReservationRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.RenewReservationResponse:
        return rknn_pb2.RenewReservationResponse(expires_in_s=self.reservations.renew(request.token))

    async def ReleaseReservation(
        self, request: rknn_pb2.ReleaseReservationRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.ReleaseReservationResponse:
        self.reservations.release(request.token)
        return rknn_pb2.ReleaseReservationResponse()

    # -- Shared-memory tensors (server/core/shm.py) -----------------------------------------------

    def _shared_memory_info(self, context: grpc.aio.ServicerContext) -> rknn_pb2.SharedMemoryInfo:
        refused = self.shared.refusal_for(context.peer() or "")
        limits = self.shared.limits
        return rknn_pb2.SharedMemoryInfo(
            allowed=refused is None,
            reason=refused or "",
            boot_id=self.shared.boot_id,
            max_regions_per_client=limits.max_regions_per_client,
            max_bytes_per_client=limits.max_bytes_per_client,
            doorbell=refused is None and self.doorbells is not None and self.doorbells.available,
        )

    async def RegisterSharedMemory(
        self, request: rknn_pb2.RegisterSharedMemoryRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.RegisterSharedMemoryResponse:
        uid = self.shared.admit(context.peer() or "")
        owner = client_identity()
        if request.session_id:
            current_call().session = self.plane.session(request.session_id, owner, usable=False).id
        memfd = (request.pid, request.fd) if request.memfd else None
        region = self.shared.register(
            owner, uid, request.key, request.name, request.size, request.session_id, memfd
        )
        if request.session_id:  # closed meanwhile (its close ran in the executor): go with it
            try:
                self.plane.session(request.session_id, owner, usable=False)
            except Exception:
                self.shared.unregister(owner, request.key)
                raise
        return rknn_pb2.RegisterSharedMemoryResponse(
            size=region.size, device=region.device, inode=region.inode, mapped=region.map is not None
        )

    async def UnregisterSharedMemory(
        self, request: rknn_pb2.UnregisterSharedMemoryRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.UnregisterSharedMemoryResponse:
        return rknn_pb2.UnregisterSharedMemoryResponse(
            closed=self.shared.unregister(client_identity(), request.key)
        )

    async def SharedMemoryStatus(
        self, request: rknn_pb2.SharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.SharedMemoryStatusResponse:
        return rknn_pb2.SharedMemoryStatusResponse(
            regions=[
                rknn_pb2.SharedMemoryRegion(
                    key=r.key, name=r.name, size=r.size, session_id=r.session_id, uses=r.uses
                )
                for r in self.shared.mine(client_identity(), request.key)
            ]
        )

    async def RunShared(
        self, request: rknn_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.RunResponse:
        self.shared.admit(context.peer() or "", lookup=False)  # its regions passed the uid check
        header = request.header
        if request.inputs:
            raise InvalidInput("RunShared takes its inputs from regions; the request carried bytes")
        session = self._session(header.session_id)
        result = await run_shared(self.plane, self.shared, session, header, client_identity())
        return rknn_pb2.RunResponse(
            header=rknn_pb2.OutputsHeader(
                outputs=result.metas, run_time_us=result.run_time_us, frame_id=header.frame_id
            )
        )

    async def OpenDoorbell(
        self, request: rknn_pb2.OpenDoorbellRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.OpenDoorbellResponse:
        uid = self.shared.admit(context.peer() or "")  # the doorbell's connection must come from it
        if self.doorbells is None or not self.doorbells.available:
            raise FailedPrecondition(
                "this daemon offers no doorbell (GetInfo's shared_memory.doorbell is false); use RunShared"
            )
        header = request.header
        owner = client_identity()
        frame = prepare(self.plane, self.shared, self._session(header.session_id), header, owner)
        return rknn_pb2.OpenDoorbellResponse(
            address=self.doorbells.address,
            ticket=self.doorbells.open(uid, frame),
            ticket_ttl_s=TICKET_TTL_S,
        )


async def _first(iterator: AsyncIterator[T], what: str) -> T:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        raise InvalidInput(f"the request stream was empty; expected {what} first") from None


__all__ = ["RknnService", "ServiceConfig"]
