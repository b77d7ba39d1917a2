"""Property-based fuzzing of every RPC of a real daemon with malformed and extreme messages.

Each message must get a non-OK status that is not an unhandled daemon error, or a correct result,
and the daemon must stay healthy. Model manifests are also fuzzed by shape (file counts, sizes,
names, digests, duplicates): well-formed ones upload, each kind of malformed one gets its status
before anything reaches the disk. Bounded for CI; RKNN_FUZZ_EXAMPLES=5000 runs a longer campaign.
"""

from __future__ import annotations

import os
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rknn_client.errors import RknnError
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import entries_of, manifest_digest
from rknn_proto.version import PROTOCOL_VERSION_METADATA_KEY
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import InvalidInput, ResourceExhausted
from rknn_server.store.manifests import validate_manifest
from tests.reliability.conftest import StartDaemon, cnn_input, device, info, raw_upload, wire_manifest
from tests.reliability.hostile_models import PLACES, SIZE, reader_model, upload_raw

EXAMPLES = int(os.environ.get("RKNN_FUZZ_EXAMPLES", "600"))
U32, U64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
I32, I64 = st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)
HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
TEXT = st.one_of(st.text(max_size=80), st.sampled_from(["", "../etc/passwd", "a/b", ".main", "x" * 300]))
BLOB = st.binary(max_size=4096)
SMALL = st.one_of(st.integers(-3, 300), I64)


def _files() -> st.SearchStrategy[list[rknn_pb2.ModelFile]]:
    file = st.builds(
        rknn_pb2.ModelFile, name=TEXT, size=st.one_of(st.integers(0, 5000), U64), sha256=st.one_of(HEX, TEXT)
    )
    return st.lists(file, max_size=4)


MANIFESTS = st.builds(rknn_pb2.ModelManifest, digest=st.one_of(HEX, TEXT), files=_files())
METAS = st.builds(
    rknn_pb2.TensorMeta,
    name=TEXT,
    dtype=st.one_of(st.integers(0, 12), I32),
    shape=st.lists(st.one_of(st.integers(-2, 40), I64), max_size=20),
    layout=st.one_of(st.integers(0, 3), I32),
    byte_length=st.one_of(st.integers(0, 4096), U64),
    pass_through=st.booleans(),
)
TENSOR_CHUNKS = st.builds(
    rknn_pb2.TensorChunk, tensor_index=st.one_of(st.integers(0, 3), U32), offset=SMALL.map(abs), data=BLOB
)


def _valid_model_upload(blob: bytes) -> list[rknn_pb2.UploadModelRequest]:
    """A well-formed upload of random bytes as a model: it caches, then fails to load as a model."""
    import hashlib

    from rknn_proto.manifest import FileEntry, manifest_digest

    sha = hashlib.sha256(blob).hexdigest()
    manifest = rknn_pb2.ModelManifest(
        digest=manifest_digest([FileEntry("fuzz.onnx", len(blob), sha)]),
        files=[rknn_pb2.ModelFile(name="fuzz.onnx", size=len(blob), sha256=sha)],
    )
    return [
        rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=manifest, start_offsets=[0])),
        rknn_pb2.UploadModelRequest(chunk=rknn_pb2.UploadChunk(file_index=0, offset=0, data=blob)),
    ]


def test_every_rpc_survives_malformed_and_extreme_messages(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons(
        "--max-tensor-elements", "1000000", "--max-tensor-bytes", str(64 << 20), "--max-sessions", "64"
    )
    with device(daemon) as dev, dev.load(cnn) as session, grpc.insecure_channel(daemon.address) as channel:
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        digest = dev.upload(cnn).digest
        session_ids = st.one_of(st.just(session.id), TEXT)
        good_meta = rknn_pb2.TensorMeta(
            dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, 3, 16, 16], byte_length=3072, layout=1
        )
        metas = st.one_of(METAS, st.just(good_meta))
        opened: list[str] = []

        def frame(data: st.DataObject) -> list[rknn_pb2.InferenceRequest]:
            header = rknn_pb2.InferenceHeader(
                session_id=data.draw(session_ids),
                inputs=data.draw(st.lists(metas, max_size=4)),
                frame_id=data.draw(U64),
                native_outputs=data.draw(st.booleans()),
            )
            chunks = data.draw(st.lists(TENSOR_CHUNKS, max_size=4))
            if data.draw(st.booleans()):
                chunks = [
                    rknn_pb2.TensorChunk(
                        tensor_index=0, offset=0, data=data.draw(st.binary(min_size=3072, max_size=3072))
                    )
                ]
            messages = [rknn_pb2.InferenceRequest(header=header)] * data.draw(st.integers(0, 2))
            messages += [rknn_pb2.InferenceRequest(chunk=c) for c in chunks]
            return messages

        def reserve(data: st.DataObject) -> Any:
            """A granted reservation is given back at once, so it does not shut InitRuntime out."""
            reply = stub.Reserve(
                rknn_pb2.ReserveRequest(
                    holder=data.draw(TEXT),
                    ttl_s=data.draw(st.one_of(st.floats(-10, 2), st.floats(allow_nan=True))),
                    wait_s=data.draw(st.floats(0, 0.2)),
                    token=data.draw(TEXT),
                ),
                timeout=30,
            )
            stub.ReleaseReservation(rknn_pb2.ReleaseReservationRequest(token=reply.token), timeout=30)
            return reply

        def run(data: st.DataObject) -> Any:
            header = rknn_pb2.InferenceHeader(
                session_id=data.draw(session_ids), inputs=data.draw(st.lists(metas, max_size=4))
            )
            inputs = data.draw(st.one_of(st.lists(BLOB, max_size=4), st.just([bytes(3072)])))
            return stub.Run(rknn_pb2.RunRequest(header=header, inputs=inputs), timeout=30)

        def upload(data: st.DataObject) -> Any:
            if data.draw(st.booleans()):
                messages = _valid_model_upload(data.draw(BLOB))
            else:
                header = rknn_pb2.UploadHeader(
                    manifest=data.draw(MANIFESTS), start_offsets=data.draw(st.lists(U64, max_size=4))
                )
                chunks = data.draw(
                    st.lists(
                        st.builds(rknn_pb2.UploadChunk, file_index=U32, offset=SMALL.map(abs), data=BLOB),
                        max_size=3,
                    )
                )
                messages = [rknn_pb2.UploadModelRequest(header=header)] * data.draw(st.integers(0, 2))
                messages += [rknn_pb2.UploadModelRequest(chunk=c) for c in chunks]
            return stub.UploadModel(iter(messages), timeout=30)

        def init_runtime(data: st.DataObject) -> Any:
            request = rknn_pb2.InitRuntimeRequest(
                model_digest=data.draw(st.one_of(st.just(digest), HEX, TEXT)),
                target=data.draw(TEXT),
                core_mask=data.draw(st.one_of(st.sampled_from([0, 1, 3, 7]), U32)),
                fallback_prior_device=data.draw(st.one_of(st.sampled_from(["cpu", "gpu"]), TEXT)),
                perf_debug=data.draw(st.booleans()),
            )
            reply = stub.InitRuntime(request, timeout=60)
            opened.append(reply.session_id)
            return reply

        def shared_header(data: st.DataObject) -> rknn_pb2.InferenceHeader:
            header = rknn_pb2.InferenceHeader(
                session_id=data.draw(session_ids), inputs=data.draw(st.lists(metas, max_size=4))
            )
            for slots in (header.input_regions, header.output_regions):
                for _ in range(data.draw(st.integers(0, 2))):
                    slots.add(key=data.draw(TEXT), offset=data.draw(U32), byte_length=data.draw(U32))
            return header

        rpcs: dict[str, Callable[[st.DataObject], Any]] = {
            "GetInfo": lambda d: stub.GetInfo(
                rknn_pb2.GetInfoRequest(client_protocol_version=d.draw(U32), client_version=d.draw(TEXT)),
                metadata=(
                    (
                        PROTOCOL_VERSION_METADATA_KEY,
                        d.draw(st.sampled_from(["2", "0", "-1", "x", "99999999999"])),
                    ),
                ),
                timeout=30,
            ),
            "PrepareUpload": lambda d: stub.PrepareUpload(
                rknn_pb2.PrepareUploadRequest(manifest=d.draw(MANIFESTS)), timeout=30
            ),
            "UploadModel": upload,
            "InitRuntime": init_runtime,
            "Inference": lambda d: list(stub.Inference(iter(frame(d)), timeout=30)),
            "EvalPerf": lambda d: stub.EvalPerf(
                rknn_pb2.EvalPerfRequest(session_id=d.draw(session_ids)), timeout=60
            ),
            "EvalMemory": lambda d: stub.EvalMemory(
                rknn_pb2.EvalMemoryRequest(session_id=d.draw(session_ids)), timeout=60
            ),
            "KeepAlive": lambda d: stub.KeepAlive(
                rknn_pb2.KeepAliveRequest(session_id=d.draw(session_ids)), timeout=30
            ),
            "Release": lambda d: stub.Release(rknn_pb2.ReleaseRequest(session_id=d.draw(TEXT)), timeout=30),
            "Run": run,
            "DumpLayers": lambda d: list(stub.DumpLayers(iter(frame(d)), timeout=60)),
            "InferencePipeline": lambda d: list(
                stub.InferencePipeline(iter(frame(d) * d.draw(st.integers(1, 3))), timeout=30)
            ),
            "Reserve": reserve,
            "RenewReservation": lambda d: stub.RenewReservation(
                rknn_pb2.RenewReservationRequest(token=d.draw(TEXT)), timeout=30
            ),
            "ReleaseReservation": lambda d: stub.ReleaseReservation(
                rknn_pb2.ReleaseReservationRequest(token=d.draw(TEXT)), timeout=30
            ),
            "RegisterSharedMemory": lambda d: stub.RegisterSharedMemory(
                rknn_pb2.RegisterSharedMemoryRequest(
                    key=d.draw(TEXT), name=d.draw(TEXT), size=d.draw(U32), session_id=d.draw(session_ids)
                ),
                timeout=30,
            ),
            "UnregisterSharedMemory": lambda d: stub.UnregisterSharedMemory(
                rknn_pb2.UnregisterSharedMemoryRequest(key=d.draw(TEXT)), timeout=30
            ),
            "SharedMemoryStatus": lambda d: stub.SharedMemoryStatus(
                rknn_pb2.SharedMemoryStatusRequest(key=d.draw(TEXT)), timeout=30
            ),
            "RunShared": lambda d: stub.RunShared(rknn_pb2.RunRequest(header=shared_header(d)), timeout=30),
            "OpenDoorbell": lambda d: stub.OpenDoorbell(
                rknn_pb2.OpenDoorbellRequest(header=shared_header(d)), timeout=30
            ),
        }
        assert set(rpcs) == set(rknn_pb2.DESCRIPTOR.services_by_name["RknnServer"].methods_by_name)
        outcomes: dict[str, set[str]] = {name: set() for name in rpcs}

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.data())
        def one_call(data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(rpcs)))
            try:
                result = rpcs[name](data)
            except grpc.RpcError as exc:
                details = exc.details() or ""
                assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.OK), (name, details)
                assert "internal error in the daemon" not in details, (name, details)
                outcomes[name].add(exc.code().name)
                return
            outcomes[name].add("OK")
            if name == "Inference":
                assert len(result) >= 2 and result[0].WhichOneof("part") == "header"

        one_call()
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert session.run([cnn_input()])[0].shape == (1, 10)
        for session_id in opened:
            stub.Release(rknn_pb2.ReleaseRequest(session_id=session_id), timeout=30)
        print(
            f"\n[fuzz] {EXAMPLES} examples; outcomes per RPC: { {k: sorted(v) for k, v in outcomes.items()} }"
        )
        assert info(daemon).open_sessions == 1


# Pieces the external-data locations are built from: names of the model's own files, of files in the
# daemon's working directory, and path syntax.
LOCATION_PARTS = st.sampled_from(
    ["w.bin", "m.onnx", ".main", "trap.bin", "..", ".", "", "models", "\\", "\0"]
)
LOCATIONS = st.one_of(
    st.text(max_size=60),
    st.lists(LOCATION_PARTS, min_size=1, max_size=6).map("/".join),
    st.sampled_from(["/etc/passwd", "/proc/self/environ", "*/_ORT_MEM_ADDR_/*", "./w.bin", "w.bin/"]),
)


def test_external_data_locations_load_the_models_own_file_or_are_refused(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    """For any location string, the model reads one of its own uploaded files or is refused cleanly; the daemon's
    working directory holds a `w.bin` and a `trap.bin` of secret bytes that must never come back."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    for name in ("w.bin", "trap.bin"):
        (workdir / name).write_bytes(b"SECRET-2" * 4)
    daemon = daemons(cwd=workdir)
    weights = bytes(range(30, 30 + SIZE))
    outcomes: set[str] = set()
    with device(daemon) as dev, grpc.insecure_channel(daemon.address) as channel:

        @settings(max_examples=max(EXAMPLES // 6, 50), deadline=None, database=None)
        @given(LOCATIONS, st.sampled_from(PLACES))
        def one_model(location: str, place: str) -> None:
            model = reader_model(location, place)
            digest = upload_raw(channel, [("m.onnx", model), ("w.bin", weights)])
            try:
                with dev.open_session(digest) as session:
                    (out,) = session.run([np.zeros(SIZE, np.uint8)])
            except RknnError as exc:
                message = str(exc)
                assert "FAILED_PRECONDITION" in message or "INVALID_ARGUMENT" in message, message
                assert "SECRET" not in message and str(tmp_path) not in message.replace(location, ""), message
                outcomes.add("refused")
                return
            own_files = (weights[:SIZE], model[:SIZE])
            assert bytes(np.asarray(out).astype(np.uint8)) in own_files, (location, place)
            outcomes.add("loaded")

        one_model()
    print(f"\n[fuzz] external-data locations: {sorted(outcomes)}")
    assert daemon.process.poll() is None and info(daemon).open_sessions == 0


# -- Manifest shapes ----------------------------------------------------------------------------

SHAPE_LIMITS = CacheLimits(quota_bytes=64 << 10, max_model_bytes=32 << 10, max_model_files=6)
_NAME_CHARS = string.ascii_letters + string.digits + "._-"
GOOD_NAMES = st.text(_NAME_CHARS, min_size=1, max_size=24).filter(
    lambda n: n[0] not in ".-" and ".." not in n
)
BAD_NAMES = st.one_of(
    st.sampled_from(
        ["", ".hidden", "-x", "a/b", "..", "a..b", "x" * 129, "a\x00b", "ü.onnx", "m.onnx\n", "\nm"]
    ),
    st.text(min_size=1, max_size=20).filter(lambda n: any(c not in _NAME_CHARS for c in n)),
)
# Few distinct contents, so that duplicates (same bytes in two files) are common; empty files too.
CONTENTS = st.one_of(
    st.sampled_from([b"", b"x", bytes(range(256)), b"weights" * 300]), st.binary(max_size=1500)
)
INVALID, EXHAUSTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


def _redigest(manifest: rknn_pb2.ModelManifest) -> rknn_pb2.ModelManifest:
    """The same file list under its consistent digest, so that only the mutated part is wrong."""
    manifest.digest = manifest_digest(entries_of(manifest))
    return manifest


@st.composite
def manifest_shapes(
    draw: st.DrawFn,
) -> tuple[rknn_pb2.ModelManifest, list[bytes], grpc.StatusCode, str]:
    """(manifest, file contents, expected status, mutation): a well-formed model, or one broken in one way."""
    names = draw(st.lists(GOOD_NAMES, min_size=1, max_size=SHAPE_LIMITS.max_model_files, unique=True))
    contents = [draw(CONTENTS) for _ in names]
    wire = wire_manifest(list(zip(names, contents, strict=True)))
    kind = draw(
        st.sampled_from(
            ["none", "newline_name", "bad_name", "newline_sha", "upper_sha", "short_sha", "newline_digest",
             "wrong_digest", "dup_name", "no_files", "too_many", "too_big"]
        )
    )  # fmt: skip
    i = draw(st.integers(0, len(names) - 1))
    files = wire.files
    expected = INVALID
    if kind == "none":
        expected = grpc.StatusCode.OK
    elif kind == "newline_name":
        files[i].name += "\n"
    elif kind == "bad_name":
        files[i].name = draw(BAD_NAMES)
    elif kind == "newline_sha":
        files[i].sha256 += "\n"
    elif kind == "upper_sha":
        files[i].sha256 = files[i].sha256.upper()
        if files[i].sha256 == files[i].sha256.lower():
            files[i].sha256 = "A" + files[i].sha256[1:]
    elif kind == "short_sha":
        files[i].sha256 = files[i].sha256[: draw(st.integers(0, 63))]
    elif kind == "dup_name":  # within the file count limit, which is checked first
        if len(files) < SHAPE_LIMITS.max_model_files:
            files.add(name=files[i].name, size=files[i].size, sha256=files[i].sha256)
        else:
            files[(i + 1) % len(files)].name = files[i].name
    elif kind == "no_files":
        del files[:]
    elif kind == "too_many":
        extra = SHAPE_LIMITS.max_model_files + 1 - len(files)
        for k in range(extra):
            files.add(name=f"extra{k}.bin", size=0, sha256=files[0].sha256)
        expected = EXHAUSTED
    elif kind == "too_big":
        files.add(
            name="huge.bin", size=SHAPE_LIMITS.max_model_bytes + draw(st.integers(1, 2**62)), sha256="0" * 64
        )
        expected = EXHAUSTED
    if kind not in ("none", "newline_digest", "wrong_digest", "no_files"):
        _redigest(wire)
    if kind == "newline_digest":
        wire.digest += "\n"
    elif kind == "wrong_digest":
        wire.digest = draw(HEX.filter(lambda h: h != wire.digest))
    return wire, contents, expected, kind


@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(manifest_shapes())
def test_the_manifest_validator_accepts_exactly_the_well_formed_shapes(
    shape: tuple[rknn_pb2.ModelManifest, list[bytes], grpc.StatusCode, str],
) -> None:
    wire, _, expected, kind = shape
    if expected == grpc.StatusCode.OK:
        validate_manifest(wire, SHAPE_LIMITS)
        return
    error = InvalidInput if expected == INVALID else ResourceExhausted
    try:
        validate_manifest(wire, SHAPE_LIMITS)
    except error as exc:
        assert str(exc), kind
    else:
        raise AssertionError(f"{kind}: accepted {wire}")


@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(MANIFESTS)
def test_the_manifest_validator_never_crashes_and_accepts_only_clean_names(
    manifest: rknn_pb2.ModelManifest,
) -> None:
    try:
        validate_manifest(manifest, SHAPE_LIMITS)
    except (InvalidInput, ResourceExhausted):
        return
    for f in manifest.files:
        assert 1 <= len(f.name) <= 128 and f.name[0] not in ".-" and set(f.name) <= set(_NAME_CHARS), f.name
        assert len(f.sha256) == 64 and set(f.sha256) <= set("0123456789abcdef"), f.sha256
    assert manifest.digest == manifest_digest(entries_of(manifest))


def test_manifest_shapes_against_a_live_daemon(daemons: StartDaemon, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    daemon = daemons(
        "--cache-quota", str(SHAPE_LIMITS.quota_bytes), "--max-model-bytes", str(SHAPE_LIMITS.max_model_bytes),
        "--max-model-files", str(SHAPE_LIMITS.max_model_files), cache=cache,
    )  # fmt: skip
    seen: dict[str, int] = {}

    @settings(
        max_examples=max(50, EXAMPLES // 4),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(manifest_shapes())
    def one_upload(shape: tuple[rknn_pb2.ModelManifest, list[bytes], grpc.StatusCode, str]) -> None:
        wire, contents, expected, kind = shape
        chunks = [(i, 0, data) for i, data in enumerate(contents) if data]
        code, details = raw_upload(daemon.address, wire, chunks)
        if code == grpc.StatusCode.ABORTED and "already cached" in details:
            code = grpc.StatusCode.OK  # hypothesis drew this model before
        assert code == expected, (kind, code, details)
        seen[kind] = seen.get(kind, 0) + 1
        if expected == grpc.StatusCode.OK:
            with grpc.insecure_channel(daemon.address) as channel:
                stub = rknn_pb2_grpc.RknnServerStub(channel)
                assert stub.PrepareUpload(rknn_pb2.PrepareUploadRequest(manifest=wire), timeout=30).cached
        else:  # refused from the header: nothing reached the disk
            assert "internal error" not in details and str(tmp_path) not in details, details
            assert not any((cache / "partial").iterdir()), kind
        used = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.name.startswith("."))
        assert used <= SHAPE_LIMITS.quota_bytes

    one_upload()
    print(f"\n[fuzz] manifest shapes uploaded to a live daemon: {dict(sorted(seen.items()))}")
    health = info(daemon)
    assert health.limits.model_cache_quota_bytes == SHAPE_LIMITS.quota_bytes
