"""The model cache and the upload path under attack, each against a live daemon subprocess:
abandoned uploads against a small quota and on a small disk, a manifest of 60,000 files, a client
that cancels during a resume's re-hash, two files with the same bytes, names and digests with a
trailing newline, and silent damage on disk that keeps a file's size and mtime."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rknn_proto import manifest, rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import FileEntry, manifest_digest
from rknn_server.store.uploads import BLOCK_BYTES
from rknn_server.testing import DaemonProcess
from tests.models import onnx_model
from tests.reliability.conftest import (
    StartDaemon,
    cnn_input,
    device,
    raw_upload,
    tmpfs,
    weighty_model,
    wire_manifest,
)

MIB = 1 << 20
PATIENCE_S = 90.0  # hang guard for waits on the daemon, never a measurement


def _wait(predicate: Callable[[], object], what: str, patience: float = PATIENCE_S) -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > patience:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _files_under(folder: Path) -> list[Path]:
    """The data files (not the cache's own dot files, such as who began a partial upload)."""
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]


def _chunks(data: bytes, upto: int, index: int = 0, start: int = 0) -> Iterator[tuple[int, int, bytes]]:
    for offset in range(start, upto, MIB):
        yield index, offset, data[offset : min(offset + MIB, upto)]


def _prepare(address: str, wire: rknn_pb2.ModelManifest) -> rknn_pb2.PrepareUploadResponse:
    with grpc.insecure_channel(address) as channel:
        reply: rknn_pb2.PrepareUploadResponse = rknn_pb2_grpc.RknnServerStub(channel).PrepareUpload(
            rknn_pb2.PrepareUploadRequest(manifest=wire), timeout=60
        )
        return reply


def _init_error(address: str, digest: str) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(address) as channel:
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        try:
            reply = stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest=digest), timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        stub.Release(rknn_pb2.ReleaseRequest(session_id=reply.session_id), timeout=30)
    return grpc.StatusCode.OK, ""


def _events(daemon: DaemonProcess, name: str) -> list[dict[str, object]]:
    found = []
    for line in daemon.log_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


# -- Item 6: abandoned uploads ------------------------------------------------------------------


def test_thirty_abandoned_uploads_stay_within_the_quota_across_restarts(
    daemons: StartDaemon, cnn: Path, tmp_path: Path
) -> None:
    quota = 10 * MIB
    cache = tmp_path / "cache"
    args = ("--cache-quota", str(quota), "--max-model-bytes", str(quota))
    daemon = daemons(*args, cache=cache)
    peak = 0
    last = None
    for _ in range(30):
        data = os.urandom(8 * MIB)
        last = wire_manifest([("big.onnx", data)])
        code, details = raw_upload(daemon.address, last, _chunks(data, 7 * MIB))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "kept for resume" in details, details
        peak = max(peak, _bytes_under(cache))
    print(
        f"\n[cache] 30 abandoned 8 MiB uploads, quota {quota} B: at most {peak} B on disk, {_bytes_under(cache)} B left"
    )
    assert peak <= quota
    daemon.stop()
    again = daemons(*args, cache=cache)
    assert _bytes_under(cache) <= quota
    assert last is not None and list(_prepare(again.address, last).held_bytes) == [7 * MIB]  # newest kept
    with device(again) as dev, dev.load(cnn) as session:
        assert session.run([cnn_input()])[0].shape == (1, 10)
    assert _bytes_under(cache) <= quota


def test_partial_uploads_idle_past_the_ttl_are_dropped(daemons: StartDaemon, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    daemon = daemons("--partial-ttl", "1", cache=cache)
    data = os.urandom(2 * MIB)
    wire = wire_manifest([("m.onnx", data)])
    code, _ = raw_upload(daemon.address, wire, _chunks(data, MIB))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert _files_under(cache / "partial")
    _wait(lambda: not _files_under(cache / "partial"), "the daemon to drop the idle partial upload")
    assert list(_prepare(daemon.address, wire).held_bytes) == [0]


def test_a_manifest_of_60000_files_is_refused_before_touching_the_disk(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    daemon = daemons(cache=cache)
    huge = wire_manifest([(f"f{i:05d}.bin", b"x") for i in range(60_000)])
    code, details = raw_upload(daemon.address, huge)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "max_model_files=1024" in details and "--max-model-files" in details
    # Under the limit, a header alone creates nothing: files appear with their bytes.
    small = wire_manifest([(f"f{i}.bin", bytes([i]) * 10) for i in range(50)])
    code, details = raw_upload(daemon.address, small)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "upload ended with" in details
    assert _files_under(cache / "partial") == []
    limited = daemons("--max-model-files", "3", cache=tmp_path / "other")
    code, details = raw_upload(limited.address, wire_manifest([(f"f{i}", b"y") for i in range(4)]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_model_files=3" in details


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "8m") as mount:
        yield mount


def test_abandoned_partials_on_a_full_disk_do_not_block_later_uploads(
    daemons: StartDaemon, small_disk: Path
) -> None:
    cache = small_disk / "cache"
    daemon = daemons("--cache-quota", str(1 << 30), cache=cache)  # the quota is larger than the disk
    abandoned = os.urandom(6 * MIB)
    code, _ = raw_upload(daemon.address, wire_manifest([("a.onnx", abandoned)]), _chunks(abandoned, 5 * MIB))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(2):  # not only the next one: every later upload works
        data = os.urandom(6 * MIB)
        wire = wire_manifest([("b.onnx", data)])
        code, details = raw_upload(daemon.address, wire, _chunks(data, len(data)))
        assert code == grpc.StatusCode.OK, details
        assert _prepare(daemon.address, wire).cached


def test_a_disk_filled_during_an_upload_is_a_clear_error_and_frees_its_bytes(
    daemons: StartDaemon, small_disk: Path
) -> None:
    cache = small_disk / "cache"
    daemon = daemons("--cache-quota", str(1 << 30), cache=cache)
    data = os.urandom(BLOCK_BYTES + 2 * MIB)
    wire = wire_manifest([("m.onnx", data)])
    filled = threading.Event()

    def requests() -> Iterator[rknn_pb2.UploadModelRequest]:
        yield rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=wire, start_offsets=[0]))
        for index, offset, block in _chunks(data, len(data)):
            yield rknn_pb2.UploadModelRequest(
                chunk=rknn_pb2.UploadChunk(file_index=index, offset=offset, data=block)
            )
            if offset + len(block) >= BLOCK_BYTES:  # the first block goes to disk, then it fills
                filled.wait(PATIENCE_S)

    filler = small_disk / "filler"
    with grpc.insecure_channel(daemon.address) as channel:
        call = rknn_pb2_grpc.RknnServerStub(channel).UploadModel.future(requests(), timeout=PATIENCE_S)
        _wait(lambda: _bytes_under(cache / "partial") >= MIB, "the first block on disk")
        # Another program fills the disk (unbuffered: a short last write leaves nothing to flush at close).
        with filler.open("wb", buffering=0) as fh, pytest.raises(OSError):
            while True:
                fh.write(bytes(MIB))
                fh.flush()
        filled.set()
        with pytest.raises(grpc.RpcError) as caught:
            call.result()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = caught.value.details() or ""
    assert "disk" in details and "full" in details and str(small_disk) not in details, details
    assert _files_under(cache / "partial") == []
    filler.unlink()
    code, details = raw_upload(daemon.address, wire, _chunks(data, len(data)))
    assert code == grpc.StatusCode.OK, details


# -- Item 7: the upload claim dies with its call ------------------------------------------------


def _read_chars(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/PID/io")


def test_a_client_cancelling_during_the_resume_rehash_does_not_leak_the_claim(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    daemon = daemons(cache=cache)
    size = 512 * MIB  # zeros: the held part is a sparse file, the re-hash still reads all of it
    zeros = bytes(MIB)
    digest = hashlib.sha256()
    for _ in range(size // MIB):
        digest.update(zeros)
    entry = FileEntry("big.onnx", size, digest.hexdigest())
    wire = rknn_pb2.ModelManifest(
        digest=manifest_digest([entry]),
        files=[rknn_pb2.ModelFile(name=entry.name, size=size, sha256=entry.sha256)],
    )
    assert raw_upload(daemon.address, wire, [(0, 0, zeros)])[0] == grpc.StatusCode.INVALID_ARGUMENT
    (partial,) = _files_under(cache / "partial")
    with partial.open("r+b") as fh:  # as if the client had sent all but the last MiB before it went away
        fh.truncate(size - MIB)
    held = list(_prepare(daemon.address, wire).held_bytes)
    assert held == [size - MIB]

    release = threading.Event()

    def header_then_wait() -> Iterator[rknn_pb2.UploadModelRequest]:
        yield rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=wire, start_offsets=held))
        release.wait(PATIENCE_S)

    with grpc.insecure_channel(daemon.address) as channel:
        before = _read_chars(daemon.pid)
        call = rknn_pb2_grpc.RknnServerStub(channel).UploadModel.future(
            header_then_wait(), timeout=PATIENCE_S
        )
        _wait(lambda: _read_chars(daemon.pid) - before >= 16 * MIB, "the daemon to start re-hashing")
        call.cancel()
        read = _read_chars(daemon.pid) - before
        release.set()
    assert read < size - MIB, "the cancellation came after the re-hash; the machine hashed too fast to test"

    outcome: list[grpc.StatusCode] = []

    def resumed() -> bool:
        offsets = list(_prepare(daemon.address, wire).held_bytes)
        code, details = raw_upload(daemon.address, wire, [(0, size - MIB, zeros)], offsets)
        outcome.append(code)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.ABORTED), details
        return code == grpc.StatusCode.OK

    _wait(resumed, "the cancelled call's claim to be released (every upload was ABORTED)", patience=60)
    print(
        f"\n[cache] cancelled after {read >> 20} MiB of a {size >> 20} MiB re-hash; then {[c.name for c in outcome]}"
    )
    assert _prepare(daemon.address, wire).cached


# -- Item 8: two files with the same bytes, and no server path in an INTERNAL error -------------


def _twin_weights_model(folder: Path) -> Path:
    """An ONNX model whose two weights are equal and kept in two external-data files of the same bytes."""
    w = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "twins",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w, "w1"), numpy_helper.from_array(w, "w2")],
    )
    model = onnx_model(graph)
    for tensor, location in zip(model.graph.initializer, ("w1.bin", "w2.bin"), strict=True):
        onnx.external_data_helper.set_external_data(tensor, location)
        (folder / location).write_bytes(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
    path = folder / "twins.onnx"
    onnx.save(model, str(path))
    return path


def test_two_files_with_the_same_bytes_upload_and_load(daemons: StartDaemon, tmp_path: Path) -> None:
    model = _twin_weights_model(tmp_path)
    assert (tmp_path / "w1.bin").read_bytes() == (tmp_path / "w2.bin").read_bytes()
    daemon = daemons()
    x = np.random.default_rng(4).standard_normal((1, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with device(daemon) as dev, dev.load(model) as session:
        np.testing.assert_allclose(session.run([x])[0], expected, rtol=1e-5)


def test_an_unexpected_error_reaches_the_client_with_a_reference_not_a_path(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    daemon = daemons(cache=cache)
    data = b"some model bytes"
    wire = wire_manifest([("m.onnx", data)])
    (cache / "partial" / wire.digest).write_text("a file where the daemon expects a folder")
    code, details = raw_upload(daemon.address, wire, [(0, 0, data)])
    assert code == grpc.StatusCode.INTERNAL
    assert str(tmp_path) not in details and "/partial" not in details, details
    assert "reference" in details
    reference = details.split("reference ")[1].split(")")[0]
    (logged,) = [e for e in _events(daemon, "internal_error") if e.get("reference") == reference]
    assert str(cache / "partial" / wire.digest) in str(logged.get("exception")), logged


# -- Item 11: a trailing newline is not part of a valid name or digest --------------------------


def test_names_and_digests_with_a_trailing_newline_are_refused(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    data = b"model bytes"
    for wire in (
        wire_manifest([("model.onnx\n", data)]),
        rknn_pb2.ModelManifest(
            digest=manifest_digest([FileEntry("m.onnx", len(data), hashlib.sha256(data).hexdigest() + "\n")]),
            files=[
                rknn_pb2.ModelFile(
                    name="m.onnx", size=len(data), sha256=hashlib.sha256(data).hexdigest() + "\n"
                )
            ],
        ),
    ):
        code, details = raw_upload(daemon.address, wire, [(0, 0, data)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "not allowed" in details or "not 64 lower-case hex" in details, details
        with pytest.raises(grpc.RpcError) as caught:
            _prepare(daemon.address, wire)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    digest = manifest.describe_files([cnn]).digest
    with device(daemon) as dev:
        dev.upload(cnn)
    assert _init_error(daemon.address, digest)[0] == grpc.StatusCode.OK
    code, details = _init_error(daemon.address, digest + "\n")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "64 lower-case hex" in details


# -- Item 12: silent damage on disk -------------------------------------------------------------


def _damage_keeping_size_and_mtime(path: Path) -> None:
    before = path.stat()
    with path.open("r+b") as fh:
        fh.seek(before.st_size // 2)
        byte = fh.read(1)
        fh.seek(before.st_size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )


def test_silent_damage_is_found_on_schedule_removed_and_never_served(
    daemons: StartDaemon, cnn: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    daemon = daemons("--verify-interval", "1", cache=cache)
    digest = manifest.describe_files([cnn]).digest
    with device(daemon) as dev:
        dev.load(cnn).release()
        _damage_keeping_size_and_mtime(cache / "models" / digest / cnn.name)
        _wait(lambda: _events(daemon, "model_damaged"), "the scheduled verification to find the damage")
        assert [e["digest"] for e in _events(daemon, "model_damaged")] == [digest]
        assert not (cache / "models" / digest).exists()
        code, details = _init_error(daemon.address, digest)
        assert code == grpc.StatusCode.NOT_FOUND and "damaged" in details and "upload it again" in details
        with dev.load(cnn) as session:  # the client uploads it again
            assert session.run([cnn_input()])[0].shape == (1, 10)


def test_remembered_hashes_survive_a_restart_and_verify_cache_removes_damage(
    daemons: StartDaemon, cnn: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    other = weighty_model(tmp_path / "weighty.onnx", 1)
    first = daemons(cache=cache)
    with device(first) as dev:
        dev.load(cnn).release()
        dev.load(other).release()
    first.stop()
    kept, touched = (manifest.describe_files([p]).digest for p in (cnn, other))
    stored = cache / "models" / touched / other.name
    os.utime(stored, ns=(stored.stat().st_atime_ns, stored.stat().st_mtime_ns + 1))
    second = daemons(cache=cache)
    with device(second) as dev:
        dev.load(cnn).release()
        dev.load(other).release()
    second.stop()
    assert [e["digest"] for e in _events(second, "model_hashed")] == [touched[:12]], "only the changed model"

    _damage_keeping_size_and_mtime(cache / "models" / kept / cnn.name)
    third = daemons("--verify-cache", cache=cache)
    (report,) = _events(third, "cache_verified")
    assert report["damaged"] == [kept] and report["models"] == 2
    assert not (cache / "models" / kept).exists()
    assert _init_error(third.address, kept)[0] == grpc.StatusCode.NOT_FOUND
    assert _init_error(third.address, touched)[0] == grpc.StatusCode.OK
