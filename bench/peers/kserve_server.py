"""KServe's Python model server serving the bench's ONNX models; run by the KServe venv's python
with one JSON argument (serving.Job). A `kserve.Model` per model, as KServe's docs write a custom
predictor, whose async predict runs ONNX Runtime in a thread pool; KServe's own v2 gRPC and REST, without
its per-request access and latency log lines."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kserve
from kserve import InferOutput, InferRequest, InferResponse
from kserve.utils.numpy_codec import from_np_dtype

from bench.peers.serving import Job, OrtModel, announce_when_ready, run_pool

POOL = run_pool()


class OnnxPredictor(kserve.Model):
    def __init__(self, name: str, model: OrtModel) -> None:
        super().__init__(name)
        self.model = model
        self.ready = True

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None, **_: Any
    ) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        y = await asyncio.get_running_loop().run_in_executor(POOL, self.model.run, x)
        out = InferOutput(self.model.output, list(y.shape), from_np_dtype(y.dtype))
        out.set_data_from_numpy(y, binary_data=payload.use_binary_outputs)
        return InferResponse(
            payload.id or "",
            self.name,
            [out],
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


def main() -> None:
    job = Job.from_argv()
    models = [OnnxPredictor(m.name, OrtModel(m.file)) for m in job.models]
    server = kserve.ModelServer(
        http_port=job.http_port, grpc_port=job.grpc_port, enable_latency_logging=False
    )
    for quiet in ("uvicorn.access", "kserve.trace"):  # a line a request each (ours writes its rpc line)
        logging.getLogger(quiet).disabled = True
    announce_when_ready(job)
    server.start(models)


if __name__ == "__main__":
    main()
