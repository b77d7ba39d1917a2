"""KServe v2 over gRPC (`inference.GRPCInferenceService`), served on the rknn.v1 port behind the same
guard (tokens, in-flight limits, the record and error mapping of every call): protobuf in, `V2Models`
calls, protobuf out.

Errors travel with v2 semantics: INVALID_ARGUMENT for a request that does not fit the model,
NOT_FOUND for an unknown model or version, UNAVAILABLE for a model that is not ready; each RPC is
counted and logged by the interceptor like rknn.v1's (method names `v2.<RPC>`). Two of Triton's own
additions are answered because perf_analyzer calls them before it measures: `ModelConfig` (built
from the model's metadata) and `ModelStatistics` (the model's request counts); and Triton's system
shared-memory extension (kserve/system_shm.py): an input or requested output whose parameters name a
region travels through it instead of the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import grpc

from rknn_proto.chunk_wire import Bytes
from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from rknn_proto.kserve import model_config_pb2 as config_pb
from rknn_proto.version import MAX_MESSAGE_BYTES
from rknn_proto.wire import Unusual, split_field, with_bytes_fields
from rknn_server.errors import InvalidInput
from rknn_server.kit.guard import Codecs, client_identity, current_call, serialized
from rknn_server.kit.replies import ReplyRule
from rknn_server.protocols.kserve.datatypes import reply_sizes
from rknn_server.protocols.kserve.models import InputTensor, Model, ModelMetadata, TensorMetadata, V2Models
from rknn_server.protocols.kserve.system_shm import RegionSlot, SystemRegions, parse_slot
from rknn_server.runtime.base import UnsupportedError

# The InferTensorContents field that carries each datatype's elements.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


_RAW_FIELD = pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER
_RAW_OUTPUT_FIELD = pb.ModelInferResponse.RAW_OUTPUT_CONTENTS_FIELD_NUMBER
# The most fields a request may have to be read by split_field (names, parameters, and per input its
# tensor and raw contents, and per output its tensor, for up to a thousand of each); beyond that,
# protobuf's parser reads it.
_MAX_SPLIT_FIELDS = 8 + 3 * 1024


@dataclass(frozen=True, slots=True)
class InferRequestRead:
    """A ModelInferRequest as `parse_infer_request` reads it off the wire: the message without its
    raw_input_contents, and those in order, as views of the received bytes (to_array copies one whose
    address does not suit its datatype)."""

    message: pb.ModelInferRequest
    raw: Sequence[Bytes]


def parse_infer_request(data: bytes) -> InferRequestRead:
    """ModelInfer's request deserializer (the guard's codec for it). protobuf's parser copies every
    raw input (100 us for a 602 KB MobileNetV2 input here, 6.9 ms for 8 MiB; on a board each such
    copy is milliseconds more and another input's worth of memory); read where they lie, an input of
    bytes (a quantized model's uint8 image) is never copied, a float32 one when it lies 4-aligned."""
    try:
        rest, raw = split_field(data, _RAW_FIELD, _MAX_SPLIT_FIELDS)
    except Unusual:
        message = pb.ModelInferRequest.FromString(data)
        copies = list(message.raw_input_contents)
        message.ClearField("raw_input_contents")
        return InferRequestRead(message, copies)
    return InferRequestRead(pb.ModelInferRequest.FromString(rest), raw)


_SERVICE_PATH = f"/{pb.DESCRIPTOR.services_by_name['GRPCInferenceService'].full_name}"
# The methods whose messages are read and written here rather than by the generated code (the
# guard registers them so): method path -> (request deserializer, response serializer).
CODECS: Mapping[str, Codecs] = MappingProxyType(
    {f"{_SERVICE_PATH}/ModelInfer": (parse_infer_request, serialized)}
)


def parameters_of(parameters: Mapping[str, pb.InferParameter]) -> dict[str, object]:
    """A tensor's parameters as plain values (the oneof each sets)."""
    found: dict[str, object] = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            found[key] = getattr(value, choice)
    return found


def output_regions(request: pb.ModelInferRequest) -> dict[str, RegionSlot]:
    """The requested outputs whose parameters name a shared-memory region, by name."""
    found = {}
    for output in request.outputs:
        slot = parse_slot(parameters_of(output.parameters), f"output {output.name!r}")
        if slot is not None:
            found[output.name] = slot
    return found


def decode_inputs(request: pb.ModelInferRequest, raw: Sequence[Bytes]) -> list[InputTensor]:
    """The request's inputs: each in shared memory (its parameters name a region), the others every
    one from raw_input_contents (in order: `raw`, as parse_infer_request read them) or every one from contents."""
    slots = [parse_slot(parameters_of(t.parameters), f"input {t.name!r}") for t in request.inputs]
    carried = sum(slot is None for slot in slots)
    if raw and len(raw) != carried:
        raise InvalidInput(
            f"{len(raw)} raw_input_contents for {carried} inputs outside shared memory; send one per such "
            "input, in order, or none and every input's contents"
        )
    tensors, position = [], 0
    for tensor, slot in zip(request.inputs, slots, strict=True):
        shape = tuple(tensor.shape)
        if slot is not None:
            tensors.append(InputTensor(tensor.name, tensor.datatype, shape, region=slot))
            continue
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"input {tensor.name!r} has both contents and raw_input_contents; send one"
                )
            tensors.append(InputTensor(tensor.name, tensor.datatype, shape, raw=raw[position]))
            position += 1
            continue
        field = CONTENTS_FIELD.get(tensor.datatype)
        if field is None and tensor.datatype == "FP16":
            raise InvalidInput(
                f"input {tensor.name!r}: FP16 has no contents field; send it in raw_input_contents"
            )
        values: Sequence[object] = getattr(tensor.contents, field) if field else ()
        tensors.append(InputTensor(tensor.name, tensor.datatype, shape, values=values))
    return tensors


def _tensor_metadata(items: Sequence[TensorMetadata]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape)
        for t in items
    ]


def metadata_response(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=list(meta.versions),
        platform=meta.platform,
        inputs=_tensor_metadata(meta.inputs),
        outputs=_tensor_metadata(meta.outputs),
    )


def config_response(meta: ModelMetadata) -> pb.ModelConfigResponse:
    """Triton's model configuration from the metadata: with max_batch_size 0 each tensor's dims are its
    whole shape, as clients send it; above 0, the shape after the batch dimension."""
    skip = 1 if meta.max_batch_size else 0

    def data_type(datatype: str) -> config_pb.DataType.ValueType:
        return config_pb.DataType.Value(f"TYPE_{datatype}")

    return pb.ModelConfigResponse(
        config=config_pb.ModelConfig(
            name=meta.name,
            platform=meta.platform,
            max_batch_size=meta.max_batch_size,
            input=[
                config_pb.ModelInput(name=t.name, data_type=data_type(t.datatype), dims=t.shape[skip:])
                for t in meta.inputs
            ],
            output=[
                config_pb.ModelOutput(name=t.name, data_type=data_type(t.datatype), dims=t.shape[skip:])
                for t in meta.outputs
            ],
        )
    )


def statistics_response(models: Sequence[Model]) -> pb.ModelStatisticsResponse:
    """Triton's statistics extension: each phase counts every successful request, and each request is
    one execution (the daemon batches none together)."""

    def duration(count: int, ns: int) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=count, ns=ns)

    def inference_stats(model: Model) -> pb.InferStatistics:
        stats, done = model.stats, model.stats.success_count
        return pb.InferStatistics(
            success=duration(done, stats.success_ns),
            fail=duration(stats.fail_count, stats.fail_ns),
            queue=duration(done, stats.queue_ns),
            compute_input=duration(done, stats.compute_input_ns),
            compute_infer=duration(done, stats.compute_infer_ns),
            compute_output=duration(done, stats.compute_output_ns),
        )

    return pb.ModelStatisticsResponse(
        model_stats=[
            pb.ModelStatistics(
                name=m.name,
                version=m.version,
                last_inference=m.stats.last_inference_ms,
                inference_count=m.stats.inference_count,
                execution_count=m.stats.success_count,
                inference_stats=inference_stats(m),
            )
            for m in models
        ]
    )


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self, models: V2Models, ready: Callable[[], bool], max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self.models = models
        self.ready = ready
        self.reply = ReplyRule(
            "v2 gRPC reply",
            max_message_bytes,
            f"--max-message-bytes {max_message_bytes}",
            "ask for fewer outputs, raise --max-message-bytes, or use rknn.v1's streaming Inference",
            models.plane.frame_memory,
        )

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=self.models.ready(request.name, request.version, client_identity())
        )

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        name, version, extensions = self.models.server_metadata()
        return pb.ServerMetadataResponse(name=name, version=version, extensions=list(extensions))

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        return metadata_response(await self.models.metadata(request.name, request.version, client_identity()))

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        return config_response(await self.models.metadata(request.name, request.version, client_identity()))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        return statistics_response(self.models.statistics(request.name, request.version, client_identity()))

    async def ModelInfer(  # type: ignore[override]  # its messages are read and written here (CODECS)
        self, read: InferRequestRead, context: grpc.aio.ServicerContext
    ) -> bytes:
        call = current_call()
        request, raw = read.message, read.raw
        call.bytes_in = sum(len(r) for r in raw)
        inputs, owner = decode_inputs(request, raw), client_identity()
        requested = [o.name for o in request.outputs]
        regions = output_regions(request)
        echoed = len(request.id)
        # Before compute, from the model's output shapes; then whatever they came to. Outputs
        # written into shared memory are not in the reply.
        model, outputs = await self.models.infer(
            request.model_name,
            request.model_version,
            owner,
            inputs,
            requested,
            lambda declared: self.reply.check(
                reply_sizes([d for d in declared if d.name not in regions], requested), echoed
            ),
            regions,
        )
        in_reply = [o for o in outputs if o.region is None]
        self.reply.check(reply_sizes(in_reply), echoed)
        call.bytes_out = sum(o.array.nbytes for o in in_reply)
        head = pb.ModelInferResponse(
            model_name=model.name,
            model_version=model.version,
            id=request.id,
            outputs=[
                pb.ModelInferResponse.InferOutputTensor(name=o.name, datatype=o.datatype, shape=o.shape)
                for o in outputs
            ],
        )
        # One raw_output_contents entry per output, in order (an empty one for an output in shared
        # memory), as tritonclient finds an output's bytes by its position; each copied once, into
        # the reply (protobuf copied each three times: tobytes, into the message, its serialization).
        contents = [b"" if o.region else o.wire_bytes() for o in outputs]
        return with_bytes_fields(head.SerializeToString(), _RAW_OUTPUT_FIELD, contents)

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        found = self._regions().status(client_identity(), request.name)
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                r.name: pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
                for r in found
            }
        )

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._regions().register(
            client_identity(),
            context.peer() or "",
            request.name,
            request.key,
            request.offset,
            request.byte_size,
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._regions().unregister(client_identity(), request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def _regions(self) -> SystemRegions:
        if self.models.regions is None:
            raise UnsupportedError("this daemon offers no system shared memory")
        return self.models.regions

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=e.name, version=e.version, state=e.state, reason=e.reason
                )
                for e in self.models.index(request.ready, client_identity())
            ]
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        await self.models.load(request.model_name, client_identity())
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        await self.models.unload(request.model_name, client_identity())
        return pb.RepositoryModelUnloadResponse()


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name

__all__ = [
    "SERVICE_NAME",
    "InferenceService",
    "config_response",
    "decode_inputs",
    "metadata_response",
    "statistics_response",
]
