"""Tenants never see each other's models (security finding 2), against a live daemon with two tokens.

A model uploaded over rknn.v1 belongs to the identities that uploaded its bytes; the repository's
models are shared by name. Bob, with his own token, must find nothing of Alice's upload on any door
(the v2 index, metadata, ready, infer over gRPC and REST, statistics, load, unload, and rknn.v1's
InitRuntime by digest), each refusal worded exactly as for a digest never uploaded, and Alice's
sessions must survive his attempts. Knowing the digest (or the manifest) is no shortcut: the daemon
asks him for every byte, and only once he sent them all is he an owner too.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.kserve import grpc_service_pb2 as pb
from rknn_proto.kserve import grpc_service_pb2_grpc as pb_grpc
from rknn_proto.manifest import describe_files
from rknn_proto.reasons import REASON_METADATA_KEY
from tests.metrics.conftest import MetricsDaemon, start_metrics_daemon
from tests.models import small_cnn
from tests.reliability.conftest import OTHER_TOKEN, TOKEN, cnn_input, wire_manifest

SHARED = "cnn"  # the repository's one model
IMAGE = cnn_input(0.25)


@dataclass
class Tenants:
    running: MetricsDaemon
    alices: Path  # the model Alice uploaded
    digest: str

    @property
    def address(self) -> str:
        return self.running.daemon.address


def tokens(folder: Path) -> Path:
    path = folder / "tokens"
    path.write_text(f"alice:{TOKEN}\nbob:{OTHER_TOKEN}\n")
    path.chmod(0o600)
    return path


def start(folder: Path) -> MetricsDaemon:
    """A daemon with the two tokens and a repository of one model; its cache is folder/cache."""
    repository = folder / "repository"
    if not repository.exists():
        (repository / SHARED).mkdir(parents=True)
        small_cnn(repository / SHARED / "model.onnx")
    return start_metrics_daemon(
        folder, "--model-repository", str(repository), "--auth-token-file", str(tokens(folder))
    )


def device(address: str, token: str) -> Device:
    return Device(tcp_endpoint(f"tcp://{address}"), token=token)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    folder = tmp_path_factory.mktemp("tenancy")
    running = start(folder)
    alices = small_cnn(folder / "alices.onnx", seed=7)
    with device(running.daemon.address, TOKEN) as alice:
        digest = alice.upload(alices).digest
    yield Tenants(running, alices, digest)
    assert running.daemon.stop() == 0


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def stub(tenants: Tenants) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(tenants.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details() or ""


def rest(tenants: Tenants, method: str, route: str, token: str, body: object = None) -> tuple[int, Any]:
    """(status, JSON body) of one v2 REST call with `token`."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{tenants.running.base}{route}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def infer_request(model: str) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=IMAGE.shape)],
        raw_input_contents=[IMAGE.tobytes()],
    )


def rest_infer_body() -> dict[str, object]:
    return {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": list(IMAGE.shape), "data": IMAGE.ravel().tolist()}
        ]
    }


def init_runtime(address: str, token: str, digest: str) -> rknn_pb2.InitRuntimeResponse:
    with grpc.insecure_channel(address) as channel:
        reply: rknn_pb2.InitRuntimeResponse = rknn_pb2_grpc.RknnServerStub(channel).InitRuntime(
            rknn_pb2.InitRuntimeRequest(model_digest=digest), metadata=md(token), timeout=60
        )
        return reply


def alike(given: tuple[object, str], missing: tuple[object, str], digest: str, unknown: str) -> bool:
    """The same code and message, but for the digest each names."""
    return given[0] == missing[0] and given[1].replace(digest, "<digest>") == missing[1].replace(
        unknown, "<digest>"
    )


def open_sessions(tenants: Tenants) -> int:
    with device(tenants.address, TOKEN) as alice:
        return alice.info(refresh=True).open_sessions


def test_bob_finds_nothing_of_alices_model_on_any_v2_door(
    tenants: Tenants, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    digest, unknown = tenants.digest, secrets.token_hex(32)
    assert stub.ModelInfer(infer_request(digest), metadata=md(TOKEN), timeout=60).outputs  # Alice's own
    names = [
        m.name
        for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=md(TOKEN), timeout=30).models
    ]
    assert digest in names and SHARED in names

    bob = md(OTHER_TOKEN)
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=bob, timeout=30).models
    assert [m.name for m in index] == [SHARED]
    status, listed = rest(tenants, "POST", "/v2/repository/index", OTHER_TOKEN, {})
    assert status == 200 and [m["name"] for m in listed] == [SHARED], listed
    for name in (digest, unknown):
        ready = stub.ModelReady(pb.ModelReadyRequest(name=name), metadata=bob, timeout=30)
        assert not ready.ready
        assert rest(tenants, "GET", f"/v2/models/{name}/ready", OTHER_TOKEN) == (
            503,
            {"name": name, "ready": False},
        )

    calls: dict[str, Callable[[str], object]] = {
        "metadata": lambda n: stub.ModelMetadata(pb.ModelMetadataRequest(name=n), metadata=bob, timeout=30),
        "config": lambda n: stub.ModelConfig(pb.ModelConfigRequest(name=n), metadata=bob, timeout=30),
        "infer": lambda n: stub.ModelInfer(infer_request(n), metadata=bob, timeout=60),
        "statistics": lambda n: stub.ModelStatistics(
            pb.ModelStatisticsRequest(name=n), metadata=bob, timeout=30
        ),
        "load": lambda n: stub.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name=n), metadata=bob, timeout=30
        ),
        "unload": lambda n: stub.RepositoryModelUnload(
            pb.RepositoryModelUnloadRequest(model_name=n), metadata=bob, timeout=30
        ),
    }
    for what, call in calls.items():
        given, missing = refusal(lambda c=call: c(digest)), refusal(lambda c=call: c(unknown))
        assert given[0] == grpc.StatusCode.NOT_FOUND, (what, given)
        assert alike(given, missing, digest, unknown), (what, given, missing)

    routes = {
        "metadata": ("GET", "/v2/models/{}", None),
        "config": ("GET", "/v2/models/{}/config", None),
        "stats": ("GET", "/v2/models/{}/stats", None),
        "infer": ("POST", "/v2/models/{}/infer", rest_infer_body()),
        "load": ("POST", "/v2/repository/models/{}/load", {}),
        "unload": ("POST", "/v2/repository/models/{}/unload", {}),
    }
    for what, (method, route, body) in routes.items():
        given_rest = rest(tenants, method, route.format(digest), OTHER_TOKEN, body)
        missing_rest = rest(tenants, method, route.format(unknown), OTHER_TOKEN, body)
        assert given_rest[0] == 404, (what, given_rest)
        errors = (str(given_rest[1]["error"]), str(missing_rest[1]["error"]))
        assert alike((404, errors[0]), (missing_rest[0], errors[1]), digest, unknown), (what, errors)

    everything = stub.ModelStatistics(pb.ModelStatisticsRequest(), metadata=bob, timeout=30).model_stats
    assert digest not in [s.name for s in everything]


def test_bob_cannot_open_alices_model_over_rknn_v1_and_her_sessions_survive(
    tenants: Tenants, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    digest, unknown = tenants.digest, secrets.token_hex(32)
    with device(tenants.address, TOKEN) as alice, alice.load(tenants.alices) as session:
        expected = session.run([IMAGE])[0]
        stub.ModelInfer(infer_request(digest), metadata=md(TOKEN), timeout=60)  # her v2 session too
        before = open_sessions(tenants)

        errors = []
        for name in (digest, unknown):
            with pytest.raises(grpc.RpcError) as caught:
                init_runtime(tenants.address, OTHER_TOKEN, name)
            reason = dict(caught.value.trailing_metadata() or ()).get(REASON_METADATA_KEY)
            errors.append((caught.value.code(), caught.value.details() or "", reason))
        assert errors[0][0] == grpc.StatusCode.NOT_FOUND and errors[0][2] == errors[1][2], errors
        assert alike(errors[0][:2], errors[1][:2], digest, unknown), errors
        unloading = refusal(
            lambda: stub.RepositoryModelUnload(
                pb.RepositoryModelUnloadRequest(model_name=digest), metadata=md(OTHER_TOKEN), timeout=30
            )
        )
        assert unloading[0] == grpc.StatusCode.NOT_FOUND, unloading
        assert rest(tenants, "POST", f"/v2/repository/models/{digest}/unload", OTHER_TOKEN, {})[0] == 404

        assert open_sessions(tenants) == before  # neither her rknn.v1 nor her v2 session closed
        assert np.array_equal(session.run([IMAGE])[0], expected)
        reply = stub.ModelInfer(infer_request(digest), metadata=md(TOKEN), timeout=60)
        assert np.array_equal(np.frombuffer(reply.raw_output_contents[0], np.float32), expected.ravel())


def test_both_use_the_repository_model_by_name(
    tenants: Tenants, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    answers = []
    for token in (TOKEN, OTHER_TOKEN):
        assert stub.ModelReady(pb.ModelReadyRequest(name=SHARED), metadata=md(token), timeout=30).ready
        reply = stub.ModelInfer(infer_request(SHARED), metadata=md(token), timeout=60)
        answers.append(np.frombuffer(reply.raw_output_contents[0], np.float32))
        status, body = rest(tenants, "POST", f"/v2/models/{SHARED}/infer", token, rest_infer_body())
        assert status == 200, body
        answers.append(np.asarray(body["outputs"][0]["data"], np.float32))
    assert all(np.allclose(a, answers[0], atol=1e-6) for a in answers)


def upload_call(
    address: str, manifest: rknn_pb2.ModelManifest, token: str, data: bytes = b""
) -> tuple[grpc.StatusCode, str]:
    """One UploadModel call with `token`: the header (from offset 0), then `data` as one chunk of the
    first file, then the end of the stream."""

    def requests() -> Iterator[rknn_pb2.UploadModelRequest]:
        header = rknn_pb2.UploadHeader(manifest=manifest, start_offsets=[0] * len(manifest.files))
        yield rknn_pb2.UploadModelRequest(header=header)
        if data:
            yield rknn_pb2.UploadModelRequest(chunk=rknn_pb2.UploadChunk(file_index=0, offset=0, data=data))

    with grpc.insecure_channel(address) as channel:
        try:
            rknn_pb2_grpc.RknnServerStub(channel).UploadModel(requests(), metadata=md(token), timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def prepare(address: str, manifest: rknn_pb2.ModelManifest, token: str) -> tuple[bool, list[int]]:
    with grpc.insecure_channel(address) as channel:
        reply = rknn_pb2_grpc.RknnServerStub(channel).PrepareUpload(
            rknn_pb2.PrepareUploadRequest(manifest=manifest), metadata=md(token), timeout=30
        )
    return reply.cached, list(reply.held_bytes)


def test_knowing_the_digest_is_no_shortcut_but_sending_every_byte_is(
    tenants: Tenants, tmp_path: Path
) -> None:
    address, model = tenants.address, small_cnn(tmp_path / "alices-second.onnx", seed=9)
    with device(address, TOKEN) as alice:
        digest = alice.upload(model).digest
    manifest = describe_files([model])
    assert prepare(address, manifest, TOKEN) == (True, [0])  # Alice's re-run sends nothing
    assert prepare(address, manifest, OTHER_TOKEN) == (False, [0])  # to Bob it is not there

    # The header alone, as a client that took "cached" for granted would send it: no access.
    header_only = upload_call(address, manifest, OTHER_TOKEN)
    assert header_only[0] == grpc.StatusCode.INVALID_ARGUMENT, header_only
    assert refusal(lambda: init_runtime(address, OTHER_TOKEN, digest))[0] == grpc.StatusCode.NOT_FOUND

    with device(address, OTHER_TOKEN) as bob:
        sent = bob.upload(model)
        assert not sent.cached and sent.sent_bytes == model.stat().st_size  # every byte
        assert bob.upload(model).cached  # his too now: his re-run sends nothing
        with bob.load(model) as session:
            assert session.run([IMAGE])[0].shape == (1, 10)
    assert prepare(address, manifest, TOKEN) == (True, [0])  # and still Alice's


def test_only_its_uploader_resumes_a_partial_upload_and_owners_survive_a_restart(tmp_path: Path) -> None:
    data = secrets.token_bytes(300_000)
    partial = wire_manifest([("m.onnx", data)])
    model = small_cnn(tmp_path / "carols.onnx", seed=13)
    manifest = describe_files([model])
    running = start(tmp_path)
    try:
        ended = upload_call(running.daemon.address, partial, TOKEN, data[:100_000])
        assert ended[0] == grpc.StatusCode.INVALID_ARGUMENT, ended  # ended early: kept for resume
        assert prepare(running.daemon.address, partial, TOKEN) == (False, [100_000])
        assert prepare(running.daemon.address, partial, OTHER_TOKEN) == (False, [0])
        with device(running.daemon.address, TOKEN) as alice:
            assert not alice.upload(model).cached
    finally:
        assert running.daemon.stop() == 0
    restarted = start(tmp_path)  # the same cache folder
    try:
        assert prepare(restarted.daemon.address, manifest, TOKEN) == (True, [0])
        assert prepare(restarted.daemon.address, manifest, OTHER_TOKEN) == (False, [0])
    finally:
        assert restarted.daemon.stop() == 0
