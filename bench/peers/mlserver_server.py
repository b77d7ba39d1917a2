"""MLServer serving the bench's ONNX models; run by the MLServer venv's python with one JSON argument
(serving.Job). A custom runtime (`MLModel`) per model, as MLServer's docs write one, whose async
predict runs ONNX Runtime in a thread pool. MLServer's defaults otherwise (inference in one parallel
worker process, Prometheus metrics on), without its per-request access log (debug off)."""

from __future__ import annotations

import asyncio

from mlserver import MLModel, MLServer, ModelSettings, Settings
from mlserver.codecs import NumpyCodec
from mlserver.settings import ModelParameters
from mlserver.types import InferenceRequest, InferenceResponse

from bench.peers.serving import Job, OrtModel, announce_when_ready, run_pool


class OnnxRuntimeModel(MLModel):
    """Imported by name in MLServer's worker process, which needs PYTHONPATH to reach it."""

    async def load(self) -> bool:
        assert self.settings.parameters is not None and self.settings.parameters.uri is not None
        self.model = OrtModel(self.settings.parameters.uri)
        self.pool = run_pool()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        y = await asyncio.get_running_loop().run_in_executor(self.pool, self.model.run, x)
        return InferenceResponse(
            model_name=self.name, id=payload.id, outputs=[NumpyCodec.encode_output(self.model.output, y)]
        )


# By import path: the worker process imports it there (this script itself runs as __main__).
IMPLEMENTATION = "bench.peers.mlserver_server.OnnxRuntimeModel"


async def serve(job: Job) -> None:
    """MLServer makes its worker pool as it is made, so inside the running loop."""
    settings = Settings(
        host="127.0.0.1",
        http_port=job.http_port,
        grpc_port=job.grpc_port,
        metrics_port=job.metrics_port,
        debug=False,
    )
    models = [
        ModelSettings(
            name=m.name,
            implementation=IMPLEMENTATION,
            parameters=ModelParameters(uri=str(m.file)),
        )
        for m in job.models
    ]
    await MLServer(settings).start(models)


def main() -> None:
    job = Job.from_argv()
    announce_when_ready(job)
    asyncio.run(serve(job))


if __name__ == "__main__":
    main()
