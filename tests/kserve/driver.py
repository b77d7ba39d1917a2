"""Runs in the tritonclient venv (never imported by the tests): drives a daemon with the real
`tritonclient.grpc` and `tritonclient.http` as a v2 user would, one JSON job on stdin, one JSON
answer per step on stdout. Arrays come and go as .npz files."""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, triton_to_np_dtype


def descriptor() -> dict[str, list[object]]:
    """Every field of the v2 messages: (number, type, repeated), and each RPC's types."""
    found: dict[str, list[object]] = {}

    def walk(prefix: str, message: object) -> None:
        for field in message.fields:
            repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == 3
            found[f"{prefix}.{field.name}"] = [field.number, field.type, bool(repeated)]
        for nested in message.nested_types:
            if not nested.GetOptions().map_entry:
                walk(f"{prefix}.{nested.name}", nested)

    for name, message in service_pb2.DESCRIPTOR.message_types_by_name.items():
        walk(name, message)
    for method in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        found[f"rpc.{method.name}"] = [method.input_type.full_name, method.output_type.full_name]
    return found


def infer(clients: dict[str, object], step: dict[str, object]) -> object:
    protocol = str(step["protocol"])
    module = grpcclient if protocol == "grpc" else httpclient
    binary = protocol != "http-json"
    arrays = np.load(str(step["inputs"]))
    inputs = []
    for name in arrays.files:
        array = arrays[name]
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = None
    if step.get("outputs") is not None:
        if module is httpclient:
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in step["outputs"]]
        else:
            outputs = [grpcclient.InferRequestedOutput(n) for n in step["outputs"]]
    result = clients[protocol].infer(
        str(step["model"]),
        inputs,
        model_version=str(step.get("version", "")),
        outputs=outputs,
        **headers_of(step),
    )
    reply = result.get_response()
    names = (
        [o["name"] for o in reply["outputs"]] if isinstance(reply, dict) else [o.name for o in reply.outputs]
    )
    np.savez(str(step["out"]), **{n: result.as_numpy(n) for n in names})
    return names


def shm_infer(clients: dict[str, object], step: dict[str, object]) -> object:
    """One inference with every input and the named outputs in system shared memory, as Triton's
    simple_grpc_shm_client does it: regions made, registered, used, unregistered and destroyed; the
    outputs read from their regions; the answer is the status seen while they were registered."""
    client = clients[str(step["protocol"])]
    module = grpcclient if client is clients["grpc"] else httpclient
    prefix, arrays = str(step["prefix"]), np.load(str(step["inputs"]))
    handles, inputs, outputs = [], [], []
    try:
        for index, name in enumerate(arrays.files):
            array, region = arrays[name], f"{prefix}_in{index}"
            handles.append(shm.create_shared_memory_region(region, f"/{region}", array.nbytes))
            shm.set_shared_memory_region(handles[-1], [array])
            client.register_system_shared_memory(region, f"/{region}", array.nbytes)
            tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_shared_memory(region, array.nbytes)
            inputs.append(tensor)
        sizes = dict(step["outputs"])
        for index, (name, size) in enumerate(sizes.items()):
            region = f"{prefix}_out{index}"
            handles.append(shm.create_shared_memory_region(region, f"/{region}", int(size)))
            client.register_system_shared_memory(region, f"/{region}", int(size))
            output = module.InferRequestedOutput(name)
            output.set_shared_memory(region, int(size))
            outputs.append(output)
        result = client.infer(str(step["model"]), inputs, outputs=outputs, **headers_of(step))
        status = client.get_system_shared_memory_status(**json_of(client))
        got = {}
        for index, name in enumerate(sizes):
            output = result.get_output(name)
            shape = output["shape"] if isinstance(output, dict) else list(output.shape)
            datatype = output["datatype"] if isinstance(output, dict) else output.datatype
            handle = handles[len(arrays.files) + index]
            got[name] = shm.get_contents_as_numpy(handle, triton_to_np_dtype(datatype), shape)
        np.savez(str(step["out"]), **got)
        client.unregister_system_shared_memory()
        after = client.get_system_shared_memory_status(**json_of(client))
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
    return {"status": status, "after": after}


def headers_of(step: dict[str, object]) -> dict[str, object]:
    token = step.get("token")
    return {"headers": {"authorization": f"Bearer {token}"}} if token else {}


def json_of(client: object) -> dict[str, object]:
    """The gRPC client's answer as JSON (protobuf's mapping: 64-bit integers as strings)."""
    return {"as_json": True} if isinstance(client, grpcclient.InferenceServerClient) else {}


def run(job: dict[str, object]) -> list[dict[str, object]]:
    grpc_client = grpcclient.InferenceServerClient(str(job["grpc"]))
    http_client = httpclient.InferenceServerClient(str(job["http"])) if job.get("http") else None
    clients = {"grpc": grpc_client, "http-binary": http_client, "http-json": http_client}
    answers = []
    for step in job["steps"]:
        op, model = step["op"], str(step.get("model", ""))
        client = clients[str(step.get("protocol", "grpc"))]
        try:
            if op == "descriptor":
                value: object = descriptor()
            elif op == "live":
                value = client.is_server_live(**headers_of(step))
            elif op == "ready":
                value = client.is_server_ready(**headers_of(step))
            elif op == "server_metadata":
                meta = client.get_server_metadata(**headers_of(step))
                value = (
                    meta
                    if isinstance(meta, dict)
                    else {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}
                )
            elif op == "model_ready":
                value = client.is_model_ready(model, **headers_of(step))
            elif op == "metadata":
                meta = client.get_model_metadata(model, **headers_of(step))
                if not isinstance(meta, dict):
                    meta = {
                        "name": meta.name,
                        "versions": list(meta.versions),
                        "platform": meta.platform,
                        "inputs": [
                            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                            for t in meta.inputs
                        ],
                        "outputs": [
                            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                            for t in meta.outputs
                        ],
                    }
                value = meta
            elif op == "config":  # Triton's model configuration, as a dict either way
                config = client.get_model_config(model, **headers_of(step), **json_of(client))
                value = config.get("config", config)
            elif op == "stats":
                value = client.get_inference_statistics(model, **headers_of(step), **json_of(client))
            elif op == "index":
                index = client.get_model_repository_index(**headers_of(step))
                rows = index if isinstance(index, list) else index.models
                value = [
                    r
                    if isinstance(r, dict)
                    else {"name": r.name, "version": r.version, "state": r.state, "reason": r.reason}
                    for r in rows
                ]
            elif op == "load":
                client.load_model(model, **headers_of(step))
                value = True
            elif op == "unload":
                client.unload_model(model, **headers_of(step))
                value = True
            elif op == "infer":
                value = infer(clients, step)
            elif op == "shm_infer":
                value = shm_infer(clients, step)
            else:
                raise ValueError(f"unknown op {op}")
            answers.append({"ok": value})
        except InferenceServerException as exc:
            answers.append({"error": exc.message(), "status": str(exc.status())})
    return answers


if __name__ == "__main__":
    print(json.dumps(run(json.load(sys.stdin))))
