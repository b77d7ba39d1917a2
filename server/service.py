"""The RPC handlers: validate each request, call the model cache, sessions and runtime, map errors.

Every handler goes through `_Call`, which checks the caller's protocol version, logs one event
per RPC (method, session, bytes in/out, duration, outcome) and turns exceptions into a gRPC
status with a message that says what was wrong. Blocking runtime work runs in the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
import structlog

from rknn_proto import codec, rknn_pb2, rknn_pb2_grpc
from rknn_proto.version import (
    CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_METADATA_KEY,
    RESERVATION_METADATA_KEY,
)
from rknn_server import __version__
from rknn_server.errors import FailedPrecondition, InvalidInput, ResourceExhausted, hint_metadata, status_of
from rknn_server.frames import QUANT_CODES, IncomingFrame, TruncatedStream, check_chunk, wire_outputs
from rknn_server.guard import client_identity
from rknn_server.memory import MemoryBudget, MemoryLimits
from rknn_server.metrics import DaemonMetrics
from rknn_server.model_cache import ModelCache
from rknn_server.pipeline import Pipeline, Traffic
from rknn_server.reservations import ReservationBook
from rknn_server.runtime.base import (
    Backend,
    FrequencyOutcome,
    InputFormat,
    LayerTensor,
    ModelRuntime,
    PerfResult,
    RuntimeOptions,
    TensorSpec,
    WorkerLost,
)
from rknn_server.sessions import Session, SessionRegistry
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
    tensor_limits: codec.TensorLimits
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
    memory: MemoryLimits = field(default_factory=MemoryLimits)


RuntimeOpener = Callable[[Backend, Any, RuntimeOptions], ModelRuntime]


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
                f"(daemon {PROTOCOL_VERSION}, oldest client {MIN_PROTOCOL_VERSION}); upgrade rknn_client"
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
    await context.abort(code, message, hint_metadata(exc))


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
        self,
        backend: Backend,
        cache: ModelCache,
        registry: SessionRegistry,
        executor: ThreadPoolExecutor,
        opener: RuntimeOpener,
        config: ServiceConfig,
        metrics: DaemonMetrics,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.registry = registry
        self.executor = executor
        self.opener = opener
        self.config = config
        self.metrics = metrics
        self.reservations = ReservationBook()
        self.frame_memory = MemoryBudget(config.memory.max_memory)
        self.pipeline = Pipeline(registry, config.tensor_limits, self.frame_memory, self._run)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

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

    # -- GetInfo -----------------------------------------------------------------------------

    async def GetInfo(
        self, request: rknn_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.GetInfoResponse:
        async def body(call: _Call) -> rknn_pb2.GetInfoResponse:
            caps = self.backend.capabilities
            limits = self.config.tensor_limits
            version = self.backend.version()
            return rknn_pb2.GetInfoResponse(
                daemon_version=__version__,
                protocol_version=PROTOCOL_VERSION,
                min_client_protocol_version=MIN_PROTOCOL_VERSION,
                runtime=self.backend.name,
                runtime_version=version.api,
                soc=self.backend.soc(),
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
                    max_sessions=self.registry.max_sessions,
                    max_tensor_bytes=limits.max_tensor_bytes,
                    max_model_bytes=self.cache.limits.max_model_bytes,
                    model_cache_quota_bytes=self.cache.limits.quota_bytes,
                    session_idle_timeout_s=self.registry.idle_timeout_s,
                    max_tensor_rank=limits.max_rank,
                    max_sessions_per_client=self.registry.max_per_client,
                    max_chunk_bytes=limits.max_chunk_bytes,
                    max_tensor_elements=limits.max_elements,
                    max_inflight_requests=self.config.max_inflight_requests,
                    call_timeout_s=self.config.call_timeout_s,
                ),
                runtime_reason=self.config.runtime_reason,
                model_formats=list(self.backend.model_suffixes),
                board=self.config.board,
                open_sessions=len(self.registry),
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
            cached, held = await self._blocking(self.cache.prepare, request.manifest)
            return rknn_pb2.PrepareUploadResponse(cached=cached, held_bytes=held)

        return await self._unary("PrepareUpload", context, body)

    async def UploadModel(
        self, request_iterator: AsyncIterator[rknn_pb2.UploadModelRequest], context: grpc.aio.ServicerContext
    ) -> rknn_pb2.UploadModelResponse:
        async def body(call: _Call) -> rknn_pb2.UploadModelResponse:
            first = await _first(request_iterator, "an UploadHeader")
            if first.WhichOneof("part") != "header":
                raise InvalidInput("the first UploadModel message must be an UploadHeader")
            header = first.header
            loop = asyncio.get_running_loop()
            # The claim on the model dies with this call whatever point a cancellation hits: a step
            # still running in the executor when the call ends releases it once it is done.
            step: asyncio.Future[Any] = loop.run_in_executor(
                self.executor, self.cache.begin_upload, header.manifest, list(header.start_offsets)
            )
            try:
                upload: Upload = await asyncio.shield(step)
            except BaseException:
                step.add_done_callback(_close_claimed)
                raise
            try:
                # One block is hashed and written in the executor while the next one is received.
                async for message in request_iterator:
                    if message.WhichOneof("part") != "chunk":
                        raise InvalidInput("after the header, UploadModel takes only UploadChunk messages")
                    chunk = message.chunk
                    data = chunk.data
                    check_chunk(len(data), self.config.tensor_limits)
                    block = upload.accept(chunk.file_index, chunk.offset, data)
                    call.bytes_in += len(data)
                    if block is not None:
                        await asyncio.shield(step)
                        step = loop.run_in_executor(self.executor, upload.store, block)
                await asyncio.shield(step)
                step = loop.run_in_executor(self.executor, upload.finish)
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
            self.reservations.admit(dict(context.invocation_metadata() or ()).get(RESERVATION_METADATA_KEY))
            soc = self.backend.soc()
            target = request.target.lower()
            if soc and target and target != soc:
                raise FailedPrecondition(
                    f"target mismatch: the model is meant for {target}, but this daemon's board is {soc}",
                    hints={"board_soc": soc, "target": target},
                )
            if request.core_mask not in KNOWN_CORE_MASKS:
                raise InvalidInput(
                    f"core_mask {request.core_mask:#x} is not an NPU core mask; expected one of "
                    f"{', '.join(hex(m) for m in sorted(KNOWN_CORE_MASKS))}"
                )
            fallback = request.fallback_prior_device or "cpu"
            if fallback not in ("cpu", "gpu"):
                raise InvalidInput(
                    f"fallback_prior_device {fallback!r} is not allowed; expected 'cpu' or 'gpu'"
                )
            path = await self._blocking(self.cache.main_file, request.model_digest)
            options = RuntimeOptions(
                target=target,
                perf_debug=request.perf_debug,
                eval_mem=request.eval_mem,
                core_mask=request.core_mask,
                fallback_prior_device=fallback,
                max_memory_bytes=self.config.memory.max_session_memory,
            )
            owner = client_identity()
            self.registry.reserve(owner)
            self.cache.pin(request.model_digest)
            try:
                await self._blocking(self.cache.verify, request.model_digest)
                runtime = await self._blocking(self.opener, self.backend, path, options)
            except BaseException:
                self.registry.unreserve(owner)
                self.cache.unpin(request.model_digest)
                raise
            session = self.registry.add(request.model_digest, options, runtime, owner)
            call.session = session.id
            version = await self._blocking(runtime.sdk_version) or self.backend.version()
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
        session = self.registry.get(header.session_id, client_identity())
        call.session = session.id
        frame = IncomingFrame.start(header, session, self.config.tensor_limits, self.frame_memory)
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
        call = None
        try:
            call = _Call("Inference", context, self.metrics)
            header, session, frame = await self._receive_frame(call, request_iterator)
            outputs, run_us = await self._run(session, frame.inputs(), frame.formats())
            metas, wire = wire_outputs(outputs, session.runtime.outputs, header.native_outputs)
            yield rknn_pb2.InferenceResponse(
                header=rknn_pb2.OutputsHeader(outputs=metas, run_time_us=run_us, frame_id=header.frame_id)
            )
            for response in codec.chunk_responses(wire):
                yield response
            call.bytes_out += sum(a.nbytes for a in wire)
        except asyncio.CancelledError:
            if call is not None:
                call.done("CANCELLED")
            raise
        except Exception as exc:
            await _fail_stream(call, context, exc)
        else:
            call.done("OK")

    async def Run(
        self, request: rknn_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.RunResponse:
        async def body(call: _Call) -> rknn_pb2.RunResponse:
            header = request.header
            session = self.registry.get(header.session_id, client_identity())
            call.session = session.id
            frame = IncomingFrame.start(header, session, self.config.tensor_limits, self.frame_memory)
            with frame.dropped_on_error():
                call.bytes_in = frame.add_whole(request.inputs)
            outputs, run_us = await self._run(session, frame.inputs(), frame.formats())
            metas, wire = wire_outputs(outputs, session.runtime.outputs, header.native_outputs)
            call.bytes_out = sum(a.nbytes for a in wire)
            if call.bytes_out > self.config.max_message_bytes // 2:
                raise ResourceExhausted(
                    f"the outputs are {call.bytes_out} bytes, too large for one Run message "
                    f"(max_message_bytes={self.config.max_message_bytes}); use the streaming Inference"
                )
            return rknn_pb2.RunResponse(
                header=rknn_pb2.OutputsHeader(outputs=metas, run_time_us=run_us, frame_id=header.frame_id),
                outputs=[a.tobytes() for a in wire],
            )

        return await self._unary("Run", context, body)

    async def _in_session(self, session: Session, fn: Callable[..., T], *args: Any, timed: bool = False) -> T:
        """Run one runtime call of a session, alone; a lost worker marks the session broken.

        `timed` calls (model runs) count the wait for the session's lock as queueing and the runtime
        call as compute, per model."""
        queued = time.perf_counter()
        async with session.lock:
            started = time.perf_counter()
            if session.broken:
                raise FailedPrecondition(
                    f"session {session.id!r} is broken ({session.broken}); release it and call init_runtime again"
                )
            work = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
            try:
                result = await asyncio.shield(work)
                if timed:
                    self.metrics.model_run(session.digest, started - queued, time.perf_counter() - started)
                return result
            except asyncio.CancelledError:
                # The caller went away, but the runtime is still busy: keep the session locked (so that
                # the reaper cannot free a model mid-call) until the call really ends.
                await asyncio.wait([work])
                raise
            except WorkerLost as exc:
                session.broken = str(exc)
                log.warning("session_broken", session=session.id, reason=str(exc))
                raise
            finally:
                session.renew()

    async def DumpLayers(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.DumpLayersResponse]:
        call = None
        try:
            call = _Call("DumpLayers", context, self.metrics)
            _, session, frame = await self._receive_frame(call, request_iterator)
            async with session.lock:
                # Some runtimes start their capture when asked for the iterator: that call blocks too.
                dump = await self._blocking(session.runtime.dump_layers, frame.inputs(), frame.formats())
                async with aclosing(self._step(dump)) as layers:
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
                        session.renew()
        except asyncio.CancelledError:
            if call is not None:
                call.done("CANCELLED")
            raise
        except Exception as exc:
            await _fail_stream(call, context, exc)
        else:
            call.done("OK")

    async def _step(self, layers: Iterator[LayerTensor]) -> AsyncGenerator[LayerTensor, None]:
        """Advance a runtime's blocking layer iterator in the executor, one layer at a time.

        On an early exit (client gone, send failed) the step in flight is awaited first and the
        iterator is then closed in the executor, never from two threads at once.
        """
        loop = asyncio.get_running_loop()
        step: asyncio.Future[LayerTensor | None] | None = None
        try:
            while True:
                step = loop.run_in_executor(self.executor, next, layers, None)
                layer = await asyncio.shield(step)
                if layer is None:
                    return
                yield layer
        finally:
            if step is not None and not step.done():
                await asyncio.wait([step])
            close = getattr(layers, "close", None)
            if close is not None:
                await loop.run_in_executor(self.executor, close)

    async def _run(
        self, session: Session, arrays: list[np.ndarray], formats: list[InputFormat]
    ) -> tuple[list[np.ndarray], int]:
        start = time.perf_counter()
        outputs = await self._in_session(session, session.runtime.run, arrays, formats, timed=True)
        return outputs, int((time.perf_counter() - start) * 1e6)

    async def InferencePipeline(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.InferenceResponse]:
        call = None
        traffic = Traffic()
        try:
            call = _Call("InferencePipeline", context, self.metrics)
            async with contextlib.aclosing(self.pipeline.stream(request_iterator, traffic)) as responses:
                async for response in responses:
                    yield response
        except (
            asyncio.CancelledError,
            GeneratorExit,
        ):  # the client cancelled: the task or the generator ends
            if call is not None:
                _account(call, traffic)
                call.done("CANCELLED")
            raise
        except Exception as exc:
            if call is not None:
                _account(call, traffic)
            await _fail_stream(call, context, exc)
        else:
            _account(call, traffic)
            call.done("OK")

    async def EvalPerf(
        self, request: rknn_pb2.EvalPerfRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalPerfResponse:
        async def body(call: _Call) -> rknn_pb2.EvalPerfResponse:
            session = self.registry.get(request.session_id, client_identity())
            call.session = session.id
            result, pinned = await self._in_session(session, self._measure, session.runtime, request.fix_freq)
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

    def _measure(self, runtime: ModelRuntime, fix_freq: bool) -> tuple[PerfResult, FrequencyOutcome]:
        with self.backend.measuring(fix_freq) as pinned:
            return runtime.perf(None), pinned

    async def EvalMemory(
        self, request: rknn_pb2.EvalMemoryRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalMemoryResponse:
        async def body(call: _Call) -> rknn_pb2.EvalMemoryResponse:
            session = self.registry.get(request.session_id, client_identity())
            call.session = session.id
            result = await self._in_session(session, session.runtime.memory)
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
            session = self.registry.pop(request.session_id, client_identity())
            call.session = session.id
            async with session.lock:
                await self._blocking(self.registry.close, session, "released by client")
            return rknn_pb2.ReleaseResponse()

        return await self._unary("Release", context, body)

    async def KeepAlive(
        self, request: rknn_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.KeepAliveResponse:
        async def body(call: _Call) -> rknn_pb2.KeepAliveResponse:
            session = self.registry.get(request.session_id, client_identity(), usable=False)
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
