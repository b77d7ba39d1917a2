"""KServe v2 over HTTP/REST on the daemon's HTTP listener: JSON and the binary tensor data extension.

Routes (each also under `/v2/models/{name}/versions/{version}`):
    GET  /v2                              server metadata
    GET  /v2/models/{name}                model metadata
    GET  /v2/models/{name}/ready          200 when ready, else 503
    GET  /v2/models/{name}/config         Triton's model configuration (what perf_analyzer reads)
    GET  /v2/models/{name}/stats          Triton's statistics extension: the model's request counts
    POST /v2/models/{name}/infer          inference
    POST /v2/repository/index             the repository extension (as Triton serves it)
    POST /v2/repository/models/{name}/load | unload

An inference body is a JSON header, optionally followed by the binary data of inputs whose
`parameters.binary_data_size` says how many bytes each takes (in input order), in which case the
`Inference-Header-Content-Length` header gives the JSON's length. Outputs come back as JSON `data`,
or as binary data after the JSON when the request asks (`binary_data_output`, or an output's
`binary_data`). A reply is held to --max-message-bytes and the memory budget (server/kit/replies.py),
JSON weighed at what its text can take (many times the tensor's bytes), before compute where the
model says its outputs' shapes; a reply too large is a 413 saying to ask for binary data.
Errors are `{"error": "..."}` with an HTTP status that matches the gRPC code.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from rknn_proto.version import MAX_MESSAGE_BYTES
from rknn_server.core.memory import MemoryBudget
from rknn_server.errors import InvalidInput, status_of
from rknn_server.kit.replies import ReplyRule, ReplyTooLarge, Sized
from rknn_server.observe.calls import Call, Recorder
from rknn_server.protocols.http.endpoint import Reply, Request
from rknn_server.protocols.kserve.datatypes import reply_sizes
from rknn_server.protocols.kserve.models import (
    InputTensor,
    Model,
    ModelMetadata,
    OutputTensor,
    TensorMetadata,
    V2Models,
)
from rknn_server.protocols.kserve.system_shm import RegionSlot, parse_slot

try:  # the server extra's, but on armv7l (optional, as uvloop)
    import orjson
except ImportError:  # pragma: no cover - the board images without it run the standard library's
    orjson = None  # type: ignore[assignment]

JSON = "application/json"
# For _long_integer: every digit made "0", every character that may come before a number "!".
_DIGITS_AFTER_A_MARK = bytes.maketrans(b"0123456789,[:- \t\r\n", b"0" * 10 + b"!" * 8)
_LONG_INTEGER = b"!" + b"0" * 20
HEADER_LENGTH = "inference-header-content-length"
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
JSON_SLICE = 1 << 16  # elements written as JSON at a time: one slice's text is in memory, not a tensor's
# Where a REST client puts an input's elements (messages name these, not the gRPC fields).
REST_CARRIERS = "data, or binary data after the JSON (the binary extension: parameters.binary_data_size)"
BINARY_ADVICE = (
    'ask for the outputs as binary data ("parameters": {"binary_data": true} on an output, or '
    '{"binary_data_output": true} on the request), for fewer outputs, or use gRPC'
)


@dataclasses.dataclass(frozen=True)
class HeldReply(Reply):
    """A reply whose body the memory budget counts while it exists."""

    held: object = None


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _json(status: int, value: object, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, JSON, _dumps(value), headers)


def error_reply(exc: BaseException) -> Reply:
    code, message = status_of(exc)
    # Too large for any retry: not 429, which says to retry later.
    status = 413 if isinstance(exc, ReplyTooLarge) else _HTTP_STATUS.get(code, 500)
    return _json(status, {"error": message})


def _tensors(items: Sequence[TensorMetadata]) -> list[dict[str, object]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]


def metadata_json(meta: ModelMetadata) -> dict[str, object]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": _tensors(meta.inputs),
        "outputs": _tensors(meta.outputs),
    }


def config_json(meta: ModelMetadata) -> dict[str, object]:
    """Triton's model configuration as its HTTP API writes it (dims after the batch dimension when
    max_batch_size > 0, as config_response)."""
    skip = 1 if meta.max_batch_size else 0

    def tensors(items: Sequence[TensorMetadata]) -> list[dict[str, object]]:
        return [
            {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": list(t.shape[skip:])} for t in items
        ]

    return {
        "name": meta.name,
        "platform": meta.platform,
        "max_batch_size": meta.max_batch_size,
        "input": tensors(meta.inputs),
        "output": tensors(meta.outputs),
    }


def stats_json(models: Sequence[Model]) -> dict[str, object]:
    """Triton's statistics extension, as grpc_service.statistics_response."""

    def duration(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    return {
        "model_stats": [
            {
                "name": m.name,
                "version": m.version,
                "last_inference": m.stats.last_inference_ms,
                "inference_count": m.stats.inference_count,
                "execution_count": m.stats.success_count,
                "inference_stats": {
                    "success": duration(m.stats.success_count, m.stats.success_ns),
                    "fail": duration(m.stats.fail_count, m.stats.fail_ns),
                    "queue": duration(m.stats.success_count, m.stats.queue_ns),
                    "compute_input": duration(m.stats.success_count, m.stats.compute_input_ns),
                    "compute_infer": duration(m.stats.success_count, m.stats.compute_infer_ns),
                    "compute_output": duration(m.stats.success_count, m.stats.compute_output_ns),
                },
                "batch_stats": [],
            }
            for m in models
        ]
    }


def _long_integer(text: bytes) -> bool:
    """Whether the text may hold an integer of 20 digits or more: 20 digits right after a character
    that can come before a number (any digits after a decimal point are a fraction's)."""
    return (b"!" + text.translate(_DIGITS_AFTER_A_MARK)).find(_LONG_INTEGER) >= 0


def parse_json(text: bytes | memoryview) -> object:
    """JSON as the standard library reads it, read by orjson where it is installed: tritonclient's
    MobileNetV2 input (150,528 numbers, 3 MB of JSON) parses in 21 ms instead of 50 here. The
    standard library decides what orjson refuses (NaN, Infinity, numbers beyond a double) and reads
    text that may hold an integer beyond 64 bits (orjson makes it a float: a shape of 10**30 must stay
    the integer its error names). Raises ValueError (or RecursionError) for text that is not JSON."""
    data = bytes(text)
    if orjson is not None and not _long_integer(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def _loads(body: memoryview, what: str) -> object:
    """A request body's JSON ({} for an empty body)."""
    try:
        return parse_json(body) if len(body) else {}
    except (ValueError, RecursionError):
        raise InvalidInput(f"{what} is not valid JSON") from None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput(f"{what} must be a JSON array")
    return value


def _header_and_binary(request: Request) -> tuple[dict[str, Any], memoryview]:
    """The JSON header of an inference body and the binary data after it."""
    length_text = request.headers.get(HEADER_LENGTH)
    if length_text is None:
        length = len(request.body)
    elif length_text.isdigit() and int(length_text) <= len(request.body):
        length = int(length_text)
    else:
        raise InvalidInput(
            f"Inference-Header-Content-Length {length_text[:20]!r} is not a byte count within the body "
            f"({len(request.body)} bytes)"
        )
    try:
        header = parse_json(request.body[:length])
    except (ValueError, RecursionError):
        raise InvalidInput("the inference request's JSON header is not valid JSON") from None
    return _object(header, "the inference request"), request.body[length:]


def _flat(data: object, what: str) -> np.ndarray:
    try:
        array = np.asarray(data)
    except (ValueError, TypeError):
        raise InvalidInput(f"{what}: data is not a (nested) array of numbers of one shape") from None
    if array.dtype.kind not in "biuf":
        raise InvalidInput(f"{what}: data holds {array.dtype.kind!r} values; expected numbers or booleans")
    return array.ravel()


def decode_inputs(header: Mapping[str, Any], binary: memoryview) -> list[InputTensor]:
    """The inputs of a JSON inference header, their bytes from `binary` where they say so."""
    tensors, offset = [], 0
    for index, item in enumerate(_list(header.get("inputs"), "inputs")):
        item = _object(item, f"inputs[{index}]")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise InvalidInput(f"inputs[{index}] needs a string name and datatype")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape
        ):
            raise InvalidInput(f"input {name!r}: shape must be an array of integers")
        parameters = _object(item.get("parameters", {}), f"input {name!r} parameters")
        slot = parse_slot(parameters, f"input {name!r}")
        size = parameters.get("binary_data_size")
        if slot is not None:
            tensors.append(InputTensor(name, datatype, tuple(shape), region=slot))
        elif size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= len(binary) - offset:
                raise InvalidInput(
                    f"input {name!r}: binary_data_size {size!r} is not a byte count within the "
                    f"{len(binary) - offset} bytes of binary data left"
                )
            raw = bytes(binary[offset : offset + size])
            offset += size
            tensors.append(InputTensor(name, datatype, tuple(shape), raw=raw))
        elif "data" in item:
            values = _flat(item["data"], f"input {name!r}")
            tensors.append(InputTensor(name, datatype, tuple(shape), values=values, carriers=REST_CARRIERS))
        else:
            raise InvalidInput(f"input {name!r} has neither data nor parameters.binary_data_size")
    if offset != len(binary):
        raise InvalidInput(
            f"the body holds {len(binary)} bytes of binary data, the inputs' binary_data_size add up to {offset}"
        )
    return tensors


def output_regions(header: Mapping[str, Any]) -> dict[str, RegionSlot]:
    """The requested outputs whose parameters name a shared-memory region, by name."""
    found = {}
    for item in _list(header.get("outputs", []), "outputs"):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            name = item["name"]
            slot = parse_slot(
                _object(item.get("parameters", {}), f"output {name!r} parameters"), f"output {name!r}"
            )
            if slot is not None:
                found[name] = slot
    return found


def _wanted_binary(header: Mapping[str, Any]) -> tuple[list[str], dict[str, bool]]:
    """The outputs asked for (empty: all) and, per output, whether it goes back as binary data."""
    default = bool(_object(header.get("parameters", {}), "parameters").get("binary_data_output", False))
    names, binary = [], {}
    for index, item in enumerate(_list(header.get("outputs", []), "outputs")):
        item = _object(item, f"outputs[{index}]")
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidInput(f"outputs[{index}] needs a string name")
        names.append(name)
        binary[name] = bool(
            _object(item.get("parameters", {}), f"output {name!r} parameters").get("binary_data", default)
        )
    binary.setdefault("", default)
    return names, binary


def _echoed_id(request_id: object) -> bytes:
    """The reply's `"id"` member: the request's id echoed, when it has one."""
    return b',"id":' + _dumps(request_id) if isinstance(request_id, str) and request_id else b""


def _json_numbers(values: np.ndarray) -> bytes:
    """A slice's elements as JSON text, each the number `tolist` makes of it. orjson writes them where
    it is installed (MobileNetV2's 150,528 floats: 4 ms against the standard library's 73 here; no
    element longer than JSON_ELEMENT_BYTES allows), unless a float is NaN or infinite: orjson would
    write null, the standard library writes what tritonclient's parser reads back."""
    items = values.tolist()
    numbers = values.dtype.kind in "biu" or (values.dtype.kind == "f" and bool(np.isfinite(values).all()))
    return orjson.dumps(items) if orjson is not None and numbers else _dumps(items)


def _json_data(array: np.ndarray) -> Iterator[bytes]:
    """An array's elements as a JSON array's text, a slice at a time."""
    flat = array.reshape(-1)
    yield b"["
    for start in range(0, flat.size, JSON_SLICE):
        text = _json_numbers(flat[start : start + JSON_SLICE])[1:-1]
        yield text if start == 0 else b"," + text
    yield b"]"


def infer_reply(
    name: str,
    version: str,
    request_id: object,
    outputs: Sequence[OutputTensor],
    binary: Mapping[str, bool],
    budget: MemoryBudget | None = None,
) -> Reply:
    """The reply's body, written once: the JSON header (with the `data` of JSON outputs), then the
    binary data of the others straight from their arrays; `budget` counts it while it exists."""
    head = [_dumps({"model_name": name, "model_version": version})[:-1], b',"outputs":[']
    blobs = []
    for index, output in enumerate(outputs):
        entry = _dumps({"name": output.name, "datatype": output.datatype, "shape": list(output.shape)})
        head.append(b"," if index else b"")
        if output.region is not None:  # written into the caller's shared memory: no data here
            slot = {
                "shared_memory_region": output.region.region,
                "shared_memory_byte_size": output.array.nbytes,
            }
            head.append(entry[:-1] + b',"parameters":' + _dumps(slot) + b"}")
        elif binary.get(output.name, binary[""]):
            blobs.append(output.wire_bytes())
            head.append(
                entry[:-1] + b',"parameters":' + _dumps({"binary_data_size": blobs[-1].nbytes}) + b"}"
            )
        else:
            head += [entry[:-1], b',"data":', *_json_data(output.array), b"}"]
    head += [b"]", _echoed_id(request_id), b"}"]
    length = sum(len(piece) for piece in head)
    body = b"".join([*head, *blobs])
    held = np.frombuffer(body, np.uint8)
    if budget is not None:
        budget.hold([held], "the reply")
    if not blobs:
        return HeldReply(200, JSON, body, held=held)
    return HeldReply(
        200, "application/octet-stream", body, ((HEADER_LENGTH.title(), str(length)),), held=held
    )


class RestV2:
    """The v2 REST routes over `V2Models`, for the HTTP listener (`Routes.more`)."""

    def __init__(
        self, models: V2Models, recorder: Recorder, max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self.models = models
        self.recorder = recorder
        self.budget = models.plane.frame_memory
        self.binary_reply = ReplyRule(
            "REST reply",
            max_message_bytes,
            f"--max-message-bytes {max_message_bytes}",
            "ask for fewer outputs, or raise --max-message-bytes",
            self.budget,
        )
        self.json_reply = dataclasses.replace(self.binary_reply, advice=BINARY_ADVICE)

    @staticmethod
    def posts(route: str) -> bool:
        parts = route.split("/")
        return route == "/v2/repository/index" or (
            len(parts) > 3
            and (
                (
                    parts[1:3] in (["v2", "models"], ["v2", "repository"])
                    and parts[-1] in ("infer", "load", "unload")
                )
                or (parts[1:3] == ["v2", "systemsharedmemory"] and parts[-1] in ("register", "unregister"))
            )
        )

    async def __call__(self, request: Request) -> Reply | None:
        handler = self._route(request)
        if handler is None:
            return None
        method, body = handler
        # Recorded as a gRPC call is: its metrics and one `rpc` log event.
        call, outcome = Call(f"v2.rest.{method}", request.owner), "OK"
        call.bytes_in = len(request.body)
        try:
            return await body()
        except Exception as exc:
            reply = error_reply(exc)
            outcome = status_of(exc)[0].name
            return reply
        finally:
            self.recorder.done(call, outcome)

    def _route(self, request: Request) -> tuple[str, Callable[[], Awaitable[Reply]]] | None:
        parts = [urllib.parse.unquote(p) for p in request.route.split("/")[1:]]
        if parts == ["v2"]:
            return "ServerMetadata", self._server_metadata
        if parts == ["v2", "repository", "index"]:
            return "RepositoryIndex", lambda: self._index(request)
        if len(parts) == 5 and parts[:3] == ["v2", "repository", "models"] and parts[4] in ("load", "unload"):
            action = self.models.load if parts[4] == "load" else self.models.unload
            return f"RepositoryModel{parts[4].title()}", lambda: self._repository(
                action, parts[3], request.owner
            )
        if parts[:2] == ["v2", "systemsharedmemory"]:
            return self._shared_memory(parts[2:], request)
        if len(parts) < 3 or parts[:2] != ["v2", "models"]:
            return None
        name, rest, version = parts[2], parts[3:], ""
        if rest[:1] == ["versions"] and len(rest) >= 2:
            version, rest = rest[1], rest[2:]
        if rest == []:
            return "ModelMetadata", lambda: self._metadata(name, version, request.owner)
        if rest == ["ready"]:
            return "ModelReady", lambda: self._ready(name, version, request.owner)
        if rest == ["config"]:
            return "ModelConfig", lambda: self._config(name, version, request.owner)
        if rest == ["stats"]:
            return "ModelStatistics", lambda: self._stats(name, version, request.owner)
        if rest == ["infer"]:
            return "ModelInfer", lambda: self._infer(name, version, request)
        return None

    def _shared_memory(
        self, rest: list[str], request: Request
    ) -> tuple[str, Callable[[], Awaitable[Reply]]] | None:
        """Triton's system shared-memory routes: `status`, `unregister` (every region), and under
        `region/{name}/`: `status`, `register`, `unregister`."""
        name = ""
        if len(rest) == 3 and rest[0] == "region":
            name, rest = rest[1], rest[2:]
        elif len(rest) != 1:
            return None
        regions = self.models.regions
        if regions is None:
            return None
        if rest == ["status"] and request.method == "GET":

            async def status() -> Reply:
                found = regions.status(request.owner, name)
                return _json(
                    200,
                    [
                        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                        for r in found
                    ],
                )

            return "SystemSharedMemoryStatus", status
        if rest == ["register"] and name:

            async def register() -> Reply:
                body = _object(_loads(request.body, "the register request"), "the register request")
                key, offset, size = body.get("key"), body.get("offset", 0), body.get("byte_size")
                if not isinstance(key, str) or not _count(offset) or not _count(size) or size is None:
                    raise InvalidInput(
                        "register needs a string key, an integer byte_size and an integer offset"
                    )
                regions.register(request.owner, request.peer, name, key, int(offset), int(size))
                return _json(200, {})

            return "SystemSharedMemoryRegister", register
        if rest == ["unregister"]:

            async def unregister() -> Reply:
                regions.unregister(request.owner, name)
                return _json(200, {})

            return "SystemSharedMemoryUnregister", unregister
        return None

    async def _server_metadata(self) -> Reply:
        name, version, extensions = self.models.server_metadata()
        return _json(200, {"name": name, "version": version, "extensions": list(extensions)})

    async def _metadata(self, name: str, version: str, owner: str) -> Reply:
        return _json(200, metadata_json(await self.models.metadata(name, version, owner)))

    async def _config(self, name: str, version: str, owner: str) -> Reply:
        return _json(200, config_json(await self.models.metadata(name, version, owner)))

    async def _stats(self, name: str, version: str, owner: str) -> Reply:
        return _json(200, stats_json(self.models.statistics(name, version, owner)))

    async def _ready(self, name: str, version: str, owner: str) -> Reply:
        ready = self.models.ready(name, version, owner)
        return _json(200 if ready else 503, {"name": name, "ready": ready})

    async def _index(self, request: Request) -> Reply:
        query = _loads(request.body, "the index request")
        ready = bool(_object(query, "the index request").get("ready", False))
        entries = self.models.index(ready, request.owner)
        return _json(
            200,
            [{"name": e.name, "version": e.version, "state": e.state, "reason": e.reason} for e in entries],
        )

    async def _repository(
        self, action: Callable[[str, str], Awaitable[object]], name: str, owner: str
    ) -> Reply:
        await action(name, owner)
        return _json(200, {})

    async def _infer(self, name: str, version: str, request: Request) -> Reply:
        self.models.resolve(
            name, version, request.owner
        )  # an unknown model or version first, whatever the body
        header, binary = _header_and_binary(request)
        requested, binary_out = _wanted_binary(header)
        regions = output_regions(header)
        inputs = decode_inputs(header, binary)
        echoed = len(_echoed_id(header.get("id")))

        def as_json(output: str) -> bool:
            return not binary_out.get(output, binary_out[""])

        # Before compute, from the model's output shapes; then whatever they came to.
        model, outputs = await self.models.infer(
            name,
            version,
            request.owner,
            inputs,
            requested,
            lambda declared: self._check_reply(
                reply_sizes([d for d in declared if d.name not in regions], requested, as_json), echoed
            ),
            regions,
        )
        self._check_reply(reply_sizes([o for o in outputs if o.region is None], (), as_json), echoed)
        return infer_reply(model.name, model.version, header.get("id"), outputs, binary_out, self.budget)

    def _check_reply(self, outputs: Sequence[Sized], echoed: int) -> None:
        rule = self.json_reply if any(o.encoded for o in outputs) else self.binary_reply
        rule.check(outputs, echoed)


__all__ = [
    "RestV2",
    "config_json",
    "decode_inputs",
    "error_reply",
    "infer_reply",
    "metadata_json",
    "stats_json",
]
