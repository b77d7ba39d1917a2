"""The RPC handlers: validate each request, call the model cache, sessions and runtime, map errors.

Every handler goes through `_Call`, which checks the caller's protocol version, logs one event
per RPC (method, session, bytes in/out, duration, outcome) and turns exceptions into a gRPC
status with a message that says what was wrong. Blocking runtime work runs in the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
)
from rknn_server import __version__
from rknn_server.errors import FailedPrecondition, InvalidInput, status_of
from rknn_server.frames import QUANT_CODES, IncomingFrame, wire_outputs
from rknn_server.model_cache import ModelCache
from rknn_server.pipeline import Pipeline, Traffic
from rknn_server.runtime.base import Backend, ModelRuntime, RuntimeOptions, TensorSpec
from rknn_server.sessions import Session, SessionRegistry

log = structlog.get_logger("rknn_server.rpc")
T = TypeVar("T")

# Core masks the contract defines (rknn_core_mask values).
KNOWN_CORE_MASKS = {v.number for v in rknn_pb2.CoreMask.DESCRIPTOR.values}


@dataclass(frozen=True)
class ServiceConfig:
    tensor_limits: codec.TensorLimits
    runtime_reason: str = ""
    board: str = ""


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


def _shape_fits(expected: Sequence[int], actual: Sequence[int]) -> bool:
    return len(expected) == len(actual) and all(
        e <= 0 or e == a for e, a in zip(expected, actual, strict=True)
    )


# Axis orders that turn data laid out as the first layout into the second.
PERMUTATIONS = {("NHWC", "NCHW"): (0, 3, 1, 2), ("NCHW", "NHWC"): (0, 2, 3, 1)}


def check_inputs(
    specs: Sequence[TensorSpec], metas: Sequence[rknn_pb2.TensorMeta]
) -> list[tuple[int, ...] | None]:
    """Check the declared inputs against the model before any byte is received.

    Returns, per input, the axis permutation that brings it into the model's layout (None: as is).
    """
    if len(metas) != len(specs):
        raise InvalidInput(
            f"the model has {len(specs)} input(s) ({', '.join(s.name for s in specs)}); {len(metas)} were sent"
        )
    permutations: list[tuple[int, ...] | None] = []
    for spec, meta in zip(specs, metas, strict=True):
        dtype = codec.dtype_from_wire(meta.dtype)
        shape = tuple(meta.shape)
        if dtype != spec.dtype:
            raise InvalidInput(f"input {spec.index} ({spec.name}) is {dtype}; the model expects {spec.dtype}")
        layout = codec.layout_name(meta.layout)
        permutation = PERMUTATIONS.get((layout, spec.layout)) if len(shape) == 4 else None
        effective = tuple(shape[i] for i in permutation) if permutation else shape
        if not _shape_fits(spec.shape, effective):
            raise InvalidInput(
                f"input {spec.index} ({spec.name}) has shape {list(shape)} ({layout}); the model expects "
                f"{list(spec.shape)} ({spec.layout})"
            )
        permutations.append(permutation)
    return permutations


class _Call:
    """One RPC's bookkeeping: protocol check, log event, error mapping."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
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
        log.info(
            "rpc",
            method=self.method,
            session=self.session[:12] or None,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            duration_ms=round((time.perf_counter() - self.start) * 1000, 3),
            outcome=outcome,
        )


async def _fail(call: _Call | None, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    code, message = status_of(exc)
    if call is not None:
        call.done(code.name)
    await context.abort(code, message)


class RknnService(rknn_pb2_grpc.RknnServerServicer):
    def __init__(
        self,
        backend: Backend,
        cache: ModelCache,
        registry: SessionRegistry,
        executor: ThreadPoolExecutor,
        opener: RuntimeOpener,
        config: ServiceConfig,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.registry = registry
        self.executor = executor
        self.opener = opener
        self.config = config
        self.pipeline = Pipeline(registry, config.tensor_limits, check_inputs, self._run)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _unary(
        self, method: str, context: grpc.aio.ServicerContext, body: Callable[[_Call], Awaitable[T]]
    ) -> T:
        call = None
        try:
            call = _Call(method, context)
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
                    max_message_bytes=MAX_MESSAGE_BYTES,
                    chunk_bytes=CHUNK_BYTES,
                    max_sessions=self.registry.max_sessions,
                    max_tensor_bytes=limits.max_tensor_bytes,
                    max_model_bytes=self.cache.limits.max_model_bytes,
                    model_cache_quota_bytes=self.cache.limits.quota_bytes,
                    session_idle_timeout_s=self.registry.idle_timeout_s,
                    max_tensor_rank=limits.max_rank,
                ),
                runtime_reason=self.config.runtime_reason,
                model_formats=list(self.backend.model_suffixes),
                board=self.config.board,
                open_sessions=len(self.registry),
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
            upload = await self._blocking(
                self.cache.begin_upload, header.manifest, list(header.start_offsets)
            )
            try:
                async for message in request_iterator:
                    if message.WhichOneof("part") != "chunk":
                        raise InvalidInput("after the header, UploadModel takes only UploadChunk messages")
                    chunk = message.chunk
                    upload.write(chunk.file_index, chunk.offset, chunk.data)
                    call.bytes_in += len(chunk.data)
                await self._blocking(upload.finish)
            finally:
                upload.close()
            return rknn_pb2.UploadModelResponse(
                digest=header.manifest.digest, received_bytes=upload.received_bytes
            )

        return await self._unary("UploadModel", context, body)

    # -- Sessions ----------------------------------------------------------------------------

    async def InitRuntime(
        self, request: rknn_pb2.InitRuntimeRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.InitRuntimeResponse:
        async def body(call: _Call) -> rknn_pb2.InitRuntimeResponse:
            soc = self.backend.soc()
            target = request.target.lower()
            if soc and target and target != soc:
                raise FailedPrecondition(
                    f"target mismatch: the script targets {target}, but this daemon's board is {soc}; "
                    f"use init_runtime(target='{soc}') or connect to a {target} board"
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
            )
            self.registry.reserve()
            self.cache.pin(request.model_digest)
            try:
                runtime = await self._blocking(self.opener, self.backend, path, options)
            except BaseException:
                self.registry.unreserve()
                self.cache.unpin(request.model_digest)
                raise
            session = self.registry.add(request.model_digest, options, runtime)
            call.session = session.id
            version = self.backend.version()
            return rknn_pb2.InitRuntimeResponse(
                session_id=session.id,
                inputs=[tensor_attr(s) for s in runtime.inputs],
                outputs=[tensor_attr(s) for s in runtime.outputs],
                runtime_api_version=version.api,
                runtime_driver_version=version.driver,
            )

        return await self._unary("InitRuntime", context, body)

    async def Inference(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.InferenceResponse]:
        call = None
        try:
            call = _Call("Inference", context)
            first = await _first(request_iterator, "an InferenceHeader")
            if first.WhichOneof("part") != "header":
                raise InvalidInput("the first Inference message must be an InferenceHeader")
            header = first.header
            session = self.registry.get(header.session_id)
            call.session = session.id
            frame = IncomingFrame.start(header, session, self.config.tensor_limits, check_inputs)
            async for message in request_iterator:
                if message.WhichOneof("part") != "chunk":
                    raise InvalidInput("after the header, Inference takes only TensorChunk messages")
                call.bytes_in += frame.assembler.add(message.chunk)
            outputs, run_us = await self._run(session, frame.inputs())
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
            await _fail(call, context, exc)
        else:
            call.done("OK")

    async def InferencePipeline(
        self, request_iterator: AsyncIterator[rknn_pb2.InferenceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rknn_pb2.InferenceResponse]:
        call = None
        traffic = Traffic()
        try:
            call = _Call("InferencePipeline", context)
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
            await _fail(call, context, exc)
        else:
            _account(call, traffic)
            call.done("OK")

    async def _run(self, session: Session, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        async with session.lock:
            start = time.perf_counter()
            running = asyncio.ensure_future(self._blocking(session.runtime.run, arrays))
            try:
                outputs = await asyncio.shield(running)
            except asyncio.CancelledError:
                # The caller went away, but the runtime is still busy in its thread: keep the
                # session locked until it returns, since a runtime is not safe for two calls at once.
                await asyncio.wait([running])
                raise
            session.renew()
            return outputs, int((time.perf_counter() - start) * 1e6)

    async def EvalPerf(
        self, request: rknn_pb2.EvalPerfRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalPerfResponse:
        async def body(call: _Call) -> rknn_pb2.EvalPerfResponse:
            session = self.registry.get(request.session_id)
            call.session = session.id
            async with session.lock:
                result = await self._blocking(session.runtime.perf, None)
            session.renew()
            readings = self.backend.frequencies()
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
                frequencies=[rknn_pb2.FrequencyList(kind=r.kind, values=list(r.values)) for r in readings],
                frequencies_fixed=False,
                frequency_note=(
                    "frequencies were not fixed: the host runtime has no NPU and leaves the CPU to the OS"
                    if request.fix_freq
                    else ""
                ),
                raw_text=result.raw_text,
                extra_columns=list(result.extra_columns),
            )

        return await self._unary("EvalPerf", context, body)

    async def EvalMemory(
        self, request: rknn_pb2.EvalMemoryRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.EvalMemoryResponse:
        async def body(call: _Call) -> rknn_pb2.EvalMemoryResponse:
            session = self.registry.get(request.session_id)
            call.session = session.id
            async with session.lock:
                result = await self._blocking(session.runtime.memory)
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
            session = self.registry.pop(request.session_id)
            call.session = session.id
            async with session.lock:
                await self._blocking(self.registry.close, session, "released by client")
            return rknn_pb2.ReleaseResponse()

        return await self._unary("Release", context, body)

    async def KeepAlive(
        self, request: rknn_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext
    ) -> rknn_pb2.KeepAliveResponse:
        async def body(call: _Call) -> rknn_pb2.KeepAliveResponse:
            session = self.registry.get(request.session_id)
            call.session = session.id
            return rknn_pb2.KeepAliveResponse(expires_in_s=session.expires_in())

        return await self._unary("KeepAlive", context, body)


def _account(call: _Call, traffic: Traffic) -> None:
    call.session = traffic.session
    call.bytes_in = traffic.bytes_in
    call.bytes_out = traffic.bytes_out


async def _first(iterator: AsyncIterator[T], what: str) -> T:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        raise InvalidInput(f"the request stream was empty; expected {what} first") from None


__all__ = ["RknnService", "ServiceConfig", "check_inputs", "tensor_attr"]
