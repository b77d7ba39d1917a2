"""NVIDIA PyTriton serving the bench's ONNX models; run by the PyTriton venv's python with one JSON
argument (serving.Job). PyTriton starts Triton Inference Server (tritonserver, a child process)
and binds a Python inference callable per model, two instances each (as many runs at once as our
daemon's); Triton's own v2 gRPC and REST, no batching (the bench sends batches of one)."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from bench.peers.serving import RUN_THREADS, Job, OrtModel, announce_when_ready

Requests = list[dict[str, np.ndarray]]


def infer_of(model: OrtModel) -> Callable[[Any], Requests]:
    """PyTriton's request-list callable: a reply dict for each request, in order."""

    def infer(requests: Any) -> Requests:
        return [{model.output: model.run(request[model.input])} for request in requests]

    return infer


def tensor(meta: Any) -> Tensor:
    return Tensor(name=meta.name, dtype=np.float32, shape=tuple(meta.shape))


def use_this_libpython() -> None:
    """Triton's Python stub links libpython3.X.so dynamically: let it find this interpreter's, or it
    takes the system's (Debian's 3.11.2 under pyenv's 3.11.7 stdlib fails at the first model)."""
    found = [sysconfig.get_config_var("LIBDIR"), os.environ.get("LD_LIBRARY_PATH", "")]
    os.environ["LD_LIBRARY_PATH"] = ":".join(path for path in found if path)


def main() -> None:
    job = Job.from_argv()
    use_this_libpython()
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=job.http_port,
        grpc_address="127.0.0.1",
        grpc_port=job.grpc_port,
        metrics_port=job.metrics_port,
        log_verbose=0,
    )
    # Its sockets and model store in the bench's folder (cwd), gone with it: a stopped PyTriton leaves them.
    with Triton(config=config, workspace=Path.cwd() / "pytriton-workspace") as triton:
        for served in job.models:
            model = OrtModel(served.file)
            triton.bind(
                model_name=served.name,
                infer_func=[infer_of(model)] * RUN_THREADS,
                inputs=[tensor(model.session.get_inputs()[0])],
                outputs=[tensor(model.session.get_outputs()[0])],
                config=ModelConfig(batching=False),
            )
        announce_when_ready(job)
        triton.serve()


if __name__ == "__main__":
    main()
