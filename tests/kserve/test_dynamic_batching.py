"""Triton's dynamic batcher (issue #30): concurrent requests of a model whose config.pbtxt asks for
dynamic_batching run as one batch, and each caller gets exactly its own rows back; a model without it
(here the very same file) runs each request on its own."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from rknn_server.core.data_plane import Ran, RunTimes
from rknn_server.core.sessions import Session
from rknn_server.protocols.kserve.batcher import DynamicBatcher
from rknn_server.protocols.kserve.pbtxt import Batching, ConfigError, parse_pbtxt
from rknn_server.runtime.base import InputFormat
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon
from tests.models import identity_of

# A wide window: requests sent together on a loaded machine still meet in it.
BATCHED = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n"
PLAIN = "max_batch_size: 8\n"
CALLERS = 4


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    folder = tmp_path_factory.mktemp("batching")
    for name, config in (("batched", BATCHED), ("plain", PLAIN)):
        (folder / "repository" / name / "1").mkdir(parents=True)
        identity_of(folder / "repository" / name / "1" / "model.onnx", "float32", ("N", 4))  # type: ignore[arg-type]
        (folder / "repository" / name / "config.pbtxt").write_text(config)
    running = start_metrics_daemon(folder, "--model-repository", str(folder / "repository"))
    yield running
    assert running.daemon.stop() == 0


def runs(daemon: MetricsDaemon) -> int:
    """How many runs the runtime made, all models together (the compute histograms' counts)."""
    with urllib.request.urlopen(f"{daemon.base}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return int(
        sum(float(v) for v in re.findall(r"^rknn_model_compute_seconds_count\{[^}]*\} (\S+)$", text, re.M))
    )


def infer_each(daemon: MetricsDaemon, model: str) -> list[np.ndarray]:
    """CALLERS requests at once, each from its own channel with its own rows (1 or 2 of them)."""

    def one(index: int) -> np.ndarray:
        rows = np.full((1 + index % 2, 4), float(index), np.float32)
        request = pb.ModelInferRequest(
            model_name=model,
            inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=rows.shape)],
            raw_input_contents=[rows.tobytes()],
        )
        with grpc.insecure_channel(daemon.daemon.address) as channel:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
        return np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(tuple(reply.outputs[0].shape))

    with ThreadPoolExecutor(CALLERS) as pool:
        return list(pool.map(one, range(CALLERS)))


@pytest.mark.parametrize(("model", "batches"), [("batched", True), ("plain", False)])
def test_concurrent_requests_are_batched_and_split_back(
    daemon: MetricsDaemon, model: str, batches: bool
) -> None:
    before = runs(daemon)
    answers = infer_each(daemon, model)
    for index, answer in enumerate(answers):  # each caller its own rows, however they were grouped
        assert np.array_equal(answer, np.full((1 + index % 2, 4), float(index), np.float32)), index
    made = runs(daemon) - before
    if batches:
        assert 1 <= made < CALLERS, made  # at least two of them shared a run
    else:
        assert made == CALLERS, made


def test_dynamic_batching_needs_a_batch_dimension_and_sizes_within_it() -> None:
    with pytest.raises(ConfigError, match="dynamic_batching needs max_batch_size of 1 or more"):
        parse_pbtxt("m", "dynamic_batching { }")
    with pytest.raises(ConfigError, match=r"preferred_batch_size \[16\] must lie in 1..max_batch_size 8"):
        parse_pbtxt("m", "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 16 ] }")
    batching = parse_pbtxt(
        "m", "max_batch_size: 8\n" + "dynamic_batching { preferred_batch_size: [ 4 ] }"
    ).batching
    assert batching is not None and batching.preferred_batch_sizes == (4,)


@pytest.mark.parametrize(
    ("parallel", "max_batch", "preferred"),
    [(1, 2, ()), (2, 2, ()), (2, 8, (4,))],
    ids=["1", "2", "preferred"],
)
def test_as_many_batches_run_at_once_as_the_runtime_computes_side_by_side(
    parallel: int, max_batch: int, preferred: tuple[int, ...]
) -> None:
    """One batch at a time left a 2-core PC computing on one core (batching measured 0.65x the
    throughput of none): the next batch is gathered and run while one computes, up to `parallel`;
    batches are of the largest preferred size where there is one (as Triton's), else max_batch_size."""
    in_flight, most = 0, 0
    seen: list[list[object]] = []

    async def run(sessions: list[Session], arrays: list[np.ndarray], formats: list[InputFormat]) -> Ran:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        seen.append(list(sessions))
        await asyncio.sleep(0.05)
        in_flight -= 1
        return Ran([arrays[0] * 2], 1, RunTimes())

    async def main() -> list[Ran]:
        batcher = DynamicBatcher(run, max_batch, Batching(0, preferred), parallel)
        requests = [
            batcher.run(f"session-{i}", [np.full((1, 4), i, np.float32)], [InputFormat()])  # type: ignore[arg-type]
            for i in range(8)
        ]
        return await asyncio.gather(*requests)

    answers = asyncio.run(main())
    assert [a.outputs[0][0, 0] for a in answers] == [2.0 * i for i in range(8)]  # each its own rows
    assert most == parallel
    size = max(preferred, default=max_batch)
    assert [len(s) for s in seen] == [size] * (8 // size)
    assert sorted(x for s in seen for x in s) == sorted(f"session-{i}" for i in range(8))  # type: ignore[type-var]
