"""The rknn.v1 driver: run by the project venv's python (PYTHONPATH = the project root), it calls
our daemon with `rknn_client` as its users do: per thread its own `connect` and `Device.load` of
the model file, `Session.run` of one input, each on a connection of its own. RKNN_SHM=off (set by the bench) keeps it on the wire.
Jobs on stdin (see load_loop); the job's "url" is tcp://HOST:PORT and "model" the ONNX file."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from bench.peers.load_loop import Caller, serve_jobs
from rknn_client import connect


def own_connections() -> None:
    """Give each channel its own connection, as separate client processes have: gRPC otherwise shares
    one between channels of equal target and options, so eight `connect`s of one process would be one
    TCP connection (tritonclient's callers get theirs the same way, drive_v2.GRPC_ARGS)."""
    insecure_channel = grpc.insecure_channel

    def channel(target: str, options: Any = None, compression: Any = None) -> grpc.Channel:
        return insecure_channel(
            target, [*(options or ()), ("grpc.use_local_subchannel_pool", 1)], compression
        )

    grpc.insecure_channel = channel


def make_caller(job: dict[str, Any]) -> Caller:
    x = np.random.default_rng(0).standard_normal(job["shape"]).astype(np.float32)
    device = connect(str(job["url"]))
    session = device.load(str(job["model"]))

    def close() -> None:
        session.release()
        device.close()

    return lambda: session.run([x]), close


if __name__ == "__main__":
    own_connections()
    serve_jobs(make_caller)
