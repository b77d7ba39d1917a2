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
`binary_data`). Errors are `{"error": "..."}` with an HTTP status that matches the gRPC code.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from rknn_server.calls import Call, Recorder
from rknn_server.errors import InvalidInput, status_of
from rknn_server.http_endpoint import Reply, Request
from rknn_server.kserve.models import (
    VERSION,
    InputTensor,
    Model,
    ModelMetadata,
    OutputTensor,
    TensorMetadata,
    V2Models,
)

JSON = "application/json"
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


def _json(status: int, value: object, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, JSON, json.dumps(value, separators=(",", ":")).encode(), headers)


def error_reply(exc: BaseException) -> Reply:
    code, message = status_of(exc)
    return _json(_HTTP_STATUS.get(code, 500), {"error": message})


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
    """Triton's model configuration as its HTTP API writes it: no batching, dims the whole shape."""

    def tensors(items: Sequence[TensorMetadata]) -> list[dict[str, object]]:
        return [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": list(t.shape)} for t in items]

    return {
        "name": meta.name,
        "platform": meta.platform,
        "max_batch_size": 0,
        "input": tensors(meta.inputs),
        "output": tensors(meta.outputs),
    }


def stats_json(models: Sequence[Model]) -> dict[str, object]:
    """Triton's statistics extension: success and fail counts and times; the phases it splits a
    request into (queue, compute) are not measured apart here and read zero."""

    def duration(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    zero = duration(0, 0)
    return {
        "model_stats": [
            {
                "name": m.name,
                "version": VERSION,
                "last_inference": m.stats.last_inference_ms,
                "inference_count": m.stats.success_count,
                "execution_count": m.stats.success_count,
                "inference_stats": {
                    "success": duration(m.stats.success_count, m.stats.success_ns),
                    "fail": duration(m.stats.fail_count, m.stats.fail_ns),
                    **{
                        phase: zero for phase in ("queue", "compute_input", "compute_infer", "compute_output")
                    },
                },
                "batch_stats": [],
            }
            for m in models
        ]
    }


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
        header = json.loads(bytes(request.body[:length]))
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
        size = _object(item.get("parameters", {}), f"input {name!r} parameters").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= len(binary) - offset:
                raise InvalidInput(
                    f"input {name!r}: binary_data_size {size!r} is not a byte count within the "
                    f"{len(binary) - offset} bytes of binary data left"
                )
            raw = bytes(binary[offset : offset + size])
            offset += size
            tensors.append(InputTensor(name, datatype, tuple(shape), raw=raw))
        elif "data" in item:
            tensors.append(
                InputTensor(name, datatype, tuple(shape), values=_flat(item["data"], f"input {name!r}"))
            )
        else:
            raise InvalidInput(f"input {name!r} has neither data nor parameters.binary_data_size")
    if offset != len(binary):
        raise InvalidInput(
            f"the body holds {len(binary)} bytes of binary data, the inputs' binary_data_size add up to {offset}"
        )
    return tensors


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


def infer_reply(
    name: str, version: str, request_id: object, outputs: Sequence[OutputTensor], binary: Mapping[str, bool]
) -> Reply:
    entries, blobs = [], []
    for output in outputs:
        entry: dict[str, object] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if binary.get(output.name, binary[""]):
            data = output.array.tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        else:
            entry["data"] = output.array.ravel().tolist()
        entries.append(entry)
    body: dict[str, object] = {"model_name": name, "model_version": version or "1", "outputs": entries}
    if isinstance(request_id, str) and request_id:
        body["id"] = request_id
    head = json.dumps(body, separators=(",", ":")).encode()
    if not blobs:
        return Reply(200, JSON, head)
    return Reply(
        200, "application/octet-stream", head + b"".join(blobs), ((HEADER_LENGTH.title(), str(len(head))),)
    )


class RestV2:
    """The v2 REST routes over `V2Models`, for the HTTP listener (`Routes.more`)."""

    def __init__(self, models: V2Models, recorder: Recorder) -> None:
        self.models = models
        self.recorder = recorder

    @staticmethod
    def posts(route: str) -> bool:
        parts = route.split("/")
        return route == "/v2/repository/index" or (
            len(parts) > 3
            and parts[1:3] in (["v2", "models"], ["v2", "repository"])
            and parts[-1] in ("infer", "load", "unload")
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
            return f"RepositoryModel{parts[4].title()}", lambda: self._repository(action, parts[3])
        if len(parts) < 3 or parts[:2] != ["v2", "models"]:
            return None
        name, rest, version = parts[2], parts[3:], ""
        if rest[:1] == ["versions"] and len(rest) >= 2:
            version, rest = rest[1], rest[2:]
        if rest == []:
            return "ModelMetadata", lambda: self._metadata(name, version, request.owner)
        if rest == ["ready"]:
            return "ModelReady", lambda: self._ready(name, version)
        if rest == ["config"]:
            return "ModelConfig", lambda: self._config(name, version, request.owner)
        if rest == ["stats"]:
            return "ModelStatistics", lambda: self._stats(name, version)
        if rest == ["infer"]:
            return "ModelInfer", lambda: self._infer(name, version, request)
        return None

    async def _server_metadata(self) -> Reply:
        name, version, extensions = self.models.server_metadata()
        return _json(200, {"name": name, "version": version, "extensions": list(extensions)})

    async def _metadata(self, name: str, version: str, owner: str) -> Reply:
        return _json(200, metadata_json(await self.models.metadata(name, version, owner)))

    async def _config(self, name: str, version: str, owner: str) -> Reply:
        return _json(200, config_json(await self.models.metadata(name, version, owner)))

    async def _stats(self, name: str, version: str) -> Reply:
        return _json(200, stats_json(self.models.statistics(name, version)))

    async def _ready(self, name: str, version: str) -> Reply:
        ready = self.models.ready(name, version)
        return _json(200 if ready else 503, {"name": name, "ready": ready})

    async def _index(self, request: Request) -> Reply:
        try:
            query = json.loads(bytes(request.body)) if len(request.body) else {}
        except ValueError:
            raise InvalidInput("the index request is not valid JSON") from None
        ready = bool(_object(query, "the index request").get("ready", False))
        entries = self.models.index(ready)
        return _json(
            200,
            [{"name": e.name, "version": e.version, "state": e.state, "reason": e.reason} for e in entries],
        )

    async def _repository(self, action: Callable[[str], Awaitable[object]], name: str) -> Reply:
        await action(name)
        return _json(200, {})

    async def _infer(self, name: str, version: str, request: Request) -> Reply:
        self.models.resolve(name, version)  # an unknown model or version first, whatever the body
        header, binary = _header_and_binary(request)
        requested, binary_out = _wanted_binary(header)
        model, outputs = await self.models.infer(
            name, version, request.owner, decode_inputs(header, binary), requested
        )
        return infer_reply(model.name, version, header.get("id"), outputs, binary_out)


__all__ = [
    "RestV2",
    "config_json",
    "decode_inputs",
    "error_reply",
    "infer_reply",
    "metadata_json",
    "stats_json",
]
