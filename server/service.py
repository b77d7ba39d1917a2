"""The gRPC handlers: translate protobuf to plain requests, await the data plane, translate back.

Sessions, the model cache, the executor and runs live in the data plane (data_plane.py), which
knows no protocol; the frame intake (frames.py) checks tensors once. Every handler goes through
`_Call`, which checks the caller's protocol version, logs one event per RPC (method, session, bytes
in/out, duration, outcome) and turns exceptions into a gRPC status with a message that says what
was wrong.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
import structlog

from rknn_proto import codec, rknn_pb2, rknn_pb2_grpc
from rknn_proto.reasons import Reason
from rknn_proto.version import (
    CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_METADATA_KEY,
    RESERVATION_METADATA_KEY,
)
from rknn_server import __version__
from rknn_server.data_plane import DataPlane, OpenRequest
from rknn_server.errors import FailedPrecondition, InvalidInput, ResourceExhausted, error_metadata, status_of
from rknn_server.frames import QUANT_CODES, IncomingFrame, TruncatedStream, check_chunk, wire_outputs
from rknn_server.guard import client_identity
from rknn_server.metrics import DaemonMetrics
from rknn_server.pipeline import Pipeline, Traffic
from rknn_server.reservations import ReservationBook
from rknn_server.runtime.base import TensorSpec
from rknn_server.sessions import Session
from rknn_server.upload_wire import Chunk, upload_chunk
from rknn_server.uploads import Upload

log = structlog.get_logger("rknn_server.rpc")
T = TypeVar("T")

# How long a stream that ended inside a frame waits for its cancellation to show, and how often it looks.
CANCEL_GRACE_S = 1.0
CANCEL_POLL_S = 0.01

# Core masks the contract defines (rknn_core_mask values).
KNOWN_CORE_MASKS = {v.number for v in rknn_pb2.CoreMask.DESCRIPTOR.values}


@dataclass(frozen=True)
class ServiceConfig:
    runtime_reason: str = ""
    board: str = ""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_inflight_requests: int = 0
    call_timeout_s: float = 0.0
    # Security posture, reported by GetInfo.
    auth_required: bool = False
    tls: bool = False
    insecure: bool = False
    warnings: tuple[str, ...] = ()
    instance_id: str = ""


def tensor_attr(spec: TensorSpec) -> rknn_pb2.TensorAttr:
    nbytes = int(np.prod(spec.shape)) * spec.dtype.itemsize if not spec.is_dynamic else 0
    return rknn_pb2.TensorAttr(
        index=spec.index,
        name=spec.name,
        shape=list(spec.shape),
        dtype=codec.dtype_to_wire(spec.dtype),
        layout=codec.layout_to_wire(spec.layout),
        quant_type=QUANT_CODES[spec.quant.kind],
        zero_point=spec.quant.zero_point,
        scale=spec.quant.scale,
        fl=spec.quant.fl,
        size_bytes=nbytes,
    )


class _Call:
    """One RPC's bookkeeping: protocol check, log event, error mapping."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext, metrics: DaemonMetrics) -> None:
        self.method = method
        self.metrics = metrics
        self.context = context
        self.session = ""
        self.bytes_in = 0
        self.bytes_out = 0
        self.start = time.perf_counter()
        metadata = dict(context.invocation_metadata() or ())
        version = metadata.get(PROTOCOL_VERSION_METADATA_KEY)
        if version is not None and (not str(version).isdigit() or int(version) < MIN_PROTOCOL_VERSION):
            raise FailedPrecondition(
                f"client protocol version {version} is older than this daemon supports "
                f"(daemon {PROTOCOL_VERSION}, oldest client {MIN_PROTOCOL_VERSION}); upgrade rknn_client",
                reason=Reason.PROTOCOL_TOO_OLD,
            )

    def done(self, outcome: str) -> None:
        seconds = time.perf_counter() - self.start
        self.metrics.rpc_done(self.method, outcome, seconds, self.bytes_in, self.bytes_out)
        log.info(
            "rpc",
            method=self.method,
            session=self.session[:12] or None,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            duration_ms=round(seconds * 1000, 3),
            outcome=outcome,
        )


async def _fail(call: _Call | None, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    code, message = status_of(exc)
    if call is not None:
        call.done(code.name)
    await context.abort(code, message, error_metadata(exc))


async def _fail_stream(call: _Call | None, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """End a streaming call that failed. A request stream cut short inside a frame is what a client's
    cancellation looks like to the reader when it wins the race with the cancellation itself: wait
    for that to land before blaming the client, so that a cancel is CANCELLED in the log, not
    INVALID_ARGUMENT (a cancellation ends this task meanwhile; a real truncation is answered late)."""
    if isinstance(exc, TruncatedStream):
        deadline = time.monotonic() + CANCEL_GRACE_S
        while not context.cancelled() and time.monotonic() < deadline:
            await asyncio.sleep(CANCEL_POLL_S)
    if context.cancelled():
        if call is not None:
            call.done("CANCELLED")
        return
    await _fail(call, context, exc)


class RknnService(rknn_pb2_grpc.RknnServerServicer):
    def __init__(
        self, plane: DataPlane, reservations: ReservationBook, config: ServiceConfig, metrics: DaemonMetrics
    ) -> None:
        self.plane = plane
        self.reservations = reservations
        self.config = config
        self.metrics = metrics
        self.pipeline = Pipeline(plane)

    async def _unary(
        self, method: str, context: grpc.aio.ServicerContext, body: Callable[[_Call], Awaitable[T]]
    ) -> T:
        call = None
        try:
            call = _Call(method, context, self.metrics)
            result = await body(call)
        except asyncio.CancelledError:
            if call is not None:
                call.done("CANCELLED")
            raise
        except Exception as exc:
            await _fail(call, context, exc)
            raise AssertionError("unreachable: abort raises") from exc
        call.done("OK")
        return result

    async def _streaming(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        body: Callable[[_Call], AsyncGenerator[T, None]],
        account: Callable[[_Call], None] = lambda call: None,
    ) -> AsyncGenerator[T, None]:
        """A response-streaming RPC: `body`'s responses, with the same bookkeeping as `_unary`.
        `account` copies what the body counted into the call's log event, whatever the outcome."""
        call = None
        try:
            call = _Call(method, context, self.metrics)
            async with aclosing(body(call)) as responses:
                async for response in responses:
                    yield response
        except (
            asyncio.CancelledError,
            GeneratorExit,
        ):  # the client cancelled: the task or the generator ends
            if call is not None:
                account(call)
                call.done("CANCELLED")
            raise
        except Exception as exc:
            if call is not None:
                account(call)
            await _fail_stream(call, context, exc)
        else:
            account(call)
            call.done("OK")

    # -- GetInfo -----------------------------------------------------------------------------

    async def GetInfo(
        self, request: rknn_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.GetInfoResponse:
        async def body(call: _Call) -> rknn_pb2.GetInfoResponse:
            caps = self.plane.backend.capabilities
            limits = self.plane.tensor_limits
            version = self.plane.backend.version()
            return rknn_pb2.GetInfoResponse(
                daemon_version=__version__,
                protocol_version=PROTOCOL_VERSION,
                min_client_protocol_version=MIN_PROTOCOL_VERSION,
                runtime=self.plane.backend.name,
                runtime_version=version.api,
                soc=self.plane.backend.soc(),
                driver_version=version.driver,
                capabilities=rknn_pb2.Capabilities(
                    perf_per_layer=caps.perf_per_layer,
                    memory_detail=caps.memory_detail,
                    layer_dumps=caps.layer_dumps,
                    core_mask=caps.core_mask,
                    dynamic_shape=caps.dynamic_shape,
                    fix_freq=caps.fix_freq,
                ),
                limits=rknn_pb2.Limits(
                    max_message_bytes=self.config.max_message_bytes,
                    chunk_bytes=CHUNK_BYTES,
                    max_sessions=self.plane.registry.max_sessions,
                    max_tensor_bytes=limits.max_tensor_bytes,
                    max_model_bytes=self.plane.cache.limits.max_model_bytes,
                    model_cache_quota_bytes=self.plane.cache.limits.quota_bytes,
                    session_idle_timeout_s=self.plane.registry.idle_timeout_s,
                    max_tensor_rank=limits.max_rank,
                    max_sessions_per_client=self.plane.registry.max_per_client,
                    max_chunk_bytes=limits.max_chunk_bytes,
                    max_tensor_elements=limits.max_elements,
                    max_inflight_requests=self.config.max_inflight_requests,
                    call_timeout_s=self.config.call_timeout_s,
                ),
                runtime_reason=self.config.runtime_reason,
                model_formats=list(self.plane.backend.model_suffixes),
                board=self.config.board,
                open_sessions=len(self.plane.registry),
                insecure=self.config.insecure,
                auth_required=self.config.auth_required,
                client_identity=client_identity(),
                instance_id=self.config.instance_id,
                warnings=list(self.config.warnings),
                tls=self.config.tls,
                **self.reservations.info_fields(),
            )

        return await self._unary("GetInfo", context, body)

    # -- Model transfer ----------------------------------------------------------------------

    async def PrepareUpload(
        self, request: rknn_pb2.PrepareUploadRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.PrepareUploadResponse:
        async def body(call: _Call) -> rknn_pb2.PrepareUploadResponse:
            cached, held = await self.plane.blocking(self.plane.cache.prepare, request.manifest)
            return rknn_pb2.PrepareUploadResponse(cached=cached, held_bytes=held)

        return await self._unary("PrepareUpload", context, body)

    async def UploadModel(
        self, request_iterator: AsyncIterator[rknn_pb2.UploadModelRequest], context: grpc.aio.ServicerContext
    ) -> rknn_pb2.UploadModelResponse:
        async def body(call: _Call) -> rknn_pb2.UploadModelResponse:
            first = await _first(request_iterator, "an UploadHeader")
            if isinstance(first, Chunk) or first.WhichOneof("part") != "header":
                raise InvalidInput("the first UploadModel message must be an UploadHeader")
            header = first.header
            loop = asyncio.get_running_loop()
            # The claim on the model dies with this call whatever point a cancellation hits: a step
            # still running in the executor when the call ends releases it once it is done.
            step: asyncio.Future[Any] = loop.run_in_executor(
                self.plane.executor,
                self.plane.cache.begin_upload,
                header.manifest,
                list(header.start_offsets),
            )
            try:
                upload: Upload = await asyncio.shield(step)
            except BaseException:
                step.add_done_callback(_close_claimed)
                raise
            try:
                # One block is hashed and written in the executor while the next one is received.
                async for message in request_iterator:
                    chunk = upload_chunk(message)
                    if chunk is None:
                        raise InvalidInput("after the header, UploadModel takes only UploadChunk messages")
                    check_chunk(len(chunk.data), self.plane.tensor_limits)
                    block = upload.accept(*chunk)
                    call.bytes_in += len(chunk.data)
                    if block is not None:
                        await asyncio.shield(step)
                        step = loop.run_in_executor(self.plane.executor, upload.store, block)
                await asyncio.shield(step)
                step = loop.run_in_executor(self.plane.executor, upload.finish)
                await asyncio.shield(step)
            finally:
                if step.done():
                    upload.close()
                else:
                    step.add_done_callback(lambda _: upload.close())
            return rknn_pb2.UploadModelResponse(
                digest=header.manifest.digest, received_bytes=upload.received_bytes
            )

        return await self._unary("UploadModel", context, body)

    # -- Sessions ----------------------------------------------------------------------------

    async def InitRuntime(
        self, request: rknn_pb2.InitRuntimeRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.InitRuntimeResponse:
        async def body(call: _Call) -> rknn_pb2.InitRuntimeResponse:
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
            call.session = session.id
            runtime = session.runtime
            version = await self.plane.version(session)
            return rknn_pb2.InitRuntimeResponse(
                session_id=session.id,
                inputs=[tensor_attr(s) for s in runtime.inputs],
                outputs=[tensor_attr(s) for s in runtime.outputs],
                runtime_api_version=version.api,
                runtime_driver_version=version.driver,
            )

        return await self._unary("InitRuntime", context, body)

    async def _receive_frame(
        self, call: _Call, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest]
    ) -> tuple[rknn_pb2.InferenceHeader, Session, IncomingFrame]:
        """One complete frame of an Inference-framed request stream (a header, then chunks)."""
        first = await _first(request_iterator, "an InferenceHeader")
        if first.WhichOneof("part") != "header":
            raise InvalidInput(f"the first {call.method} message must be an InferenceHeader")
        header = first.header
        session = self.plane.session(header.session_id, client_identity())
        call.session = session.id
        frame = IncomingFrame.start(header, session, self.plane.tensor_limits, self.plane.frame_memory)
        with frame.dropped_on_error():
            async for message in request_iterator:
                if message.WhichOneof("part") != "chunk":
                    raise InvalidInput(f"after the header, {call.method} takes only TensorChunk messages")
                call.bytes_in += frame.add(message.chunk)
            frame.ensure_complete("the frame")
        return header, session, frame

    async def Inference(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.InferenceResponse]:
        async def body(call: _Call) -> AsyncGenerator[rknn_pb2.InferenceResponse, None]:
            header, session, frame = await self._receive_frame(call, request_iterator)
            ran = await self.plane.run(session, frame.inputs(), frame.formats())
            metas, wire = wire_outputs(ran.outputs, session.runtime.outputs, header.native_outputs)
            yield rknn_pb2.InferenceResponse(
                header=rknn_pb2.OutputsHeader(
                    outputs=metas, run_time_us=ran.run_time_us, frame_id=header.frame_id
                )
            )
            for response in codec.chunk_responses(wire):
                yield response
            call.bytes_out += sum(a.nbytes for a in wire)

        async with aclosing(self._streaming("Inference", context, body)) as responses:
            async for response in responses:
                yield response

    async def Run(
        self, request: rknn_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.RunResponse:
        async def body(call: _Call) -> rknn_pb2.RunResponse:
            header = request.header
            session = self.plane.session(header.session_id, client_identity())
            call.session = session.id
            frame = IncomingFrame.start(header, session, self.plane.tensor_limits, self.plane.frame_memory)
            with frame.dropped_on_error():
                call.bytes_in = frame.add_whole(request.inputs)
            ran = await self.plane.run(session, frame.inputs(), frame.formats())
            metas, wire = wire_outputs(ran.outputs, session.runtime.outputs, header.native_outputs)
            call.bytes_out = sum(a.nbytes for a in wire)
            if call.bytes_out > self.config.max_message_bytes // 2:
                raise ResourceExhausted(
                    f"the outputs are {call.bytes_out} bytes, too large for one Run message "
                    f"(max_message_bytes={self.config.max_message_bytes}); use the streaming Inference"
                )
            return rknn_pb2.RunResponse(
                header=rknn_pb2.OutputsHeader(
                    outputs=metas, run_time_us=ran.run_time_us, frame_id=header.frame_id
                ),
                outputs=[a.tobytes() for a in wire],
            )

        return await self._unary("Run", context, body)

    async def DumpLayers(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.DumpLayersResponse]:
        async def body(call: _Call) -> AsyncGenerator[rknn_pb2.DumpLayersResponse, None]:
            _, session, frame = await self._receive_frame(call, request_iterator)
            async with aclosing(self.plane.layers(session, frame.inputs(), frame.formats())) as layers:
                async for layer in layers:
                    wire = codec.wire_array(layer.array)
                    yield rknn_pb2.DumpLayersResponse(
                        layer=rknn_pb2.LayerDumpHeader(
                            index=layer.index,
                            op_type=layer.op_type,
                            node_name=layer.node_name,
                            tensor_name=layer.tensor_name,
                            tensor=codec.meta_of(wire, layer.tensor_name),
                        )
                    )
                    for chunk in codec.iter_chunks([wire]):
                        call.bytes_out += len(chunk.data)
                        yield rknn_pb2.DumpLayersResponse(chunk=chunk)

        async with aclosing(self._streaming("DumpLayers", context, body)) as responses:
            async for response in responses:
                yield response

    async def InferencePipeline(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.InferenceResponse]:
        traffic = Traffic()

        def body(call: _Call) -> AsyncGenerator[rknn_pb2.InferenceResponse, None]:
            return self.pipeline.stream(request_iterator, traffic)

        def account(call: _Call) -> None:
            _account(call, traffic)

        async with aclosing(self._streaming("InferencePipeline", context, body, account)) as responses:
            async for response in responses:
                yield response

    async def EvalPerf(
        self, request: rknn_pb2.EvalPerfRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalPerfResponse:
        async def body(call: _Call) -> rknn_pb2.EvalPerfResponse:
            session = self.plane.session(request.session_id, client_identity())
            call.session = session.id
            result, pinned = await self.plane.perf(session, request.fix_freq)
            return rknn_pb2.EvalPerfResponse(
                layers=[
                    rknn_pb2.LayerPerf(
                        index=row.index,
                        op_type=row.op_type,
                        data_type=row.data_type,
                        target=row.target,
                        input_shapes=list(row.input_shapes),
                        output_shape=row.output_shape,
                        time_us=row.time_us,
                        name=row.name,
                        extra=row.extra,
                    )
                    for row in result.layers
                ],
                total_time_us=result.total_time_us,
                total_operator_time_us=result.total_operator_time_us,
                total_rw_kb=result.total_rw_kb,
                frequencies=[
                    rknn_pb2.FrequencyList(kind=r.kind, values=list(r.values)) for r in pinned.frequencies
                ],
                frequencies_fixed=pinned.fixed,
                frequency_note=pinned.note,
                raw_text=result.raw_text,
                extra_columns=list(result.extra_columns),
            )

        return await self._unary("EvalPerf", context, body)

    async def EvalMemory(
        self, request: rknn_pb2.EvalMemoryRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalMemoryResponse:
        async def body(call: _Call) -> rknn_pb2.EvalMemoryResponse:
            session = self.plane.session(request.session_id, client_identity())
            call.session = session.id
            result = await self.plane.memory_of(session)
            return rknn_pb2.EvalMemoryResponse(
                weight_memory=result.weight_bytes,
                internal_memory=result.internal_bytes,
                other_memory=result.other_bytes,
                total_memory=result.total_bytes,
                model_size=result.model_size,
                method=result.method,
            )

        return await self._unary("EvalMemory", context, body)

    async def Release(
        self, request: rknn_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.ReleaseResponse:
        async def body(call: _Call) -> rknn_pb2.ReleaseResponse:
            session = await self.plane.close(request.session_id, client_identity())
            call.session = session.id
            return rknn_pb2.ReleaseResponse()

        return await self._unary("Release", context, body)

    async def KeepAlive(
        self, request: rknn_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.KeepAliveResponse:
        async def body(call: _Call) -> rknn_pb2.KeepAliveResponse:
            session = self.plane.session(request.session_id, client_identity(), usable=False)
            call.session = session.id
            return rknn_pb2.KeepAliveResponse(expires_in_s=session.expires_in())

        return await self._unary("KeepAlive", context, body)

    # -- Reservations (server/reservations.py) -----------------------------------------------

    async def Reserve(
        self, request: rknn_pb2.ReserveRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.ReserveResponse:
        async def body(call: _Call) -> rknn_pb2.ReserveResponse:
            return await self.reservations.reserve(request)

        return await self._unary("Reserve", context, body)

    async def RenewReservation(
        self, request: rknn_pb2.RenewReservationRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.RenewReservationResponse:
        async def body(call: _Call) -> rknn_pb2.RenewReservationResponse:
            return self.reservations.renew(request)

        return await self._unary("RenewReservation", context, body)

    async def ReleaseReservation(
        self, request: rknn_pb2.ReleaseReservationRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.ReleaseReservationResponse:
        async def body(call: _Call) -> rknn_pb2.ReleaseReservationResponse:
            return self.reservations.release(request)

        return await self._unary("ReleaseReservation", context, body)


def _close_claimed(step: asyncio.Future[Upload]) -> None:
    """Release an upload claimed by a call that ended before it could take it."""
    if not step.cancelled() and step.exception() is None:
        step.result().close()


def _account(call: _Call, traffic: Traffic) -> None:
    call.session = traffic.session
    call.bytes_in = traffic.bytes_in
    call.bytes_out = traffic.bytes_out


async def _first(iterator: AsyncIterator[T], what: str) -> T:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        raise InvalidInput(f"the request stream was empty; expected {what} first") from None


__all__ = ["RknnService", "ServiceConfig", "tensor_attr"]
