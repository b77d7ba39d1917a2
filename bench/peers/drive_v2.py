"""The v2 driver: run by the tritonclient venv's python (PYTHONPATH = the project root, for
load_loop), it calls a server's KServe v2 gRPC or REST with the real `tritonclient`, one client
(and connection) per thread, binary tensors both ways unless the job says JSON. Jobs on stdin (see load_loop)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from bench.peers.load_loop import Caller, serve_jobs

MESSAGE_BYTES = 64 << 20
# Its own connection: without a local subchannel pool, gRPC shares one between equal channels.
GRPC_ARGS = [
    ("grpc.max_send_message_length", MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MESSAGE_BYTES),
    ("grpc.use_local_subchannel_pool", 1),
]


def make_caller(job: dict[str, Any]) -> Caller:
    x = np.random.default_rng(0).standard_normal(job["shape"]).astype(np.float32)
    model, url = str(job["model"]), str(job["url"])
    if job["protocol"] == "grpc":
        grpc_client = grpcclient.InferenceServerClient(url, channel_args=GRPC_ARGS)
        tensor = grpcclient.InferInput(job["input"], list(x.shape), np_to_triton_dtype(x.dtype))
        tensor.set_data_from_numpy(x)
        wanted = [grpcclient.InferRequestedOutput(job["output"])]
        return (
            lambda: grpc_client.infer(model, [tensor], outputs=wanted).as_numpy(job["output"]),
            grpc_client.close,
        )
    http_client = httpclient.InferenceServerClient(url, connection_timeout=60, network_timeout=60)
    body = httpclient.InferInput(job["input"], list(x.shape), np_to_triton_dtype(x.dtype))
    binary = bool(job.get("binary", True))  # False: JSON tensors, for a REST without the extension
    body.set_data_from_numpy(x, binary_data=binary)
    asked = [httpclient.InferRequestedOutput(job["output"], binary_data=binary)]
    return (
        lambda: http_client.infer(model, [body], outputs=asked).as_numpy(job["output"]),
        http_client.close,
    )


if __name__ == "__main__":
    serve_jobs(make_caller)
