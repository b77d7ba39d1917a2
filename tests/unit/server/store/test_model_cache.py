"""The model cache on its own: verified commits, resume, LRU eviction that spares pinned models."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from rknn_proto import manifest, rknn_pb2
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import Aborted, DataLoss, NotFound, ResourceExhausted
from rknn_server.store.model_cache import ModelCache
from rknn_server.store.uploads import BLOCK_BYTES, Upload
from tests.unit.server.fakes import store_model


def manifest_of(data: bytes, name: str = "m.onnx") -> rknn_pb2.ModelManifest:
    return manifest.one_file_manifest(name, data)


def test_a_model_appears_only_after_it_verified(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(1000)
    man = manifest_of(data)
    upload = cache.begin_upload(man, [0])
    upload.write(0, 0, data[:500])
    with pytest.raises(NotFound):
        cache.main_file(man.digest)
    upload.write(0, 500, data[500:])
    path = upload.finish()
    upload.close()
    assert path.read_bytes() == data and cache.main_file(man.digest) == path
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700


def test_corrupt_bytes_are_discarded_not_cached(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    man = manifest_of(b"right bytes")
    upload = cache.begin_upload(man, [0])
    upload.write(0, 0, b"wrong bytes")
    with pytest.raises(DataLoss):
        upload.finish()
    upload.close()
    assert not cache.has(man.digest)
    assert cache.prepare(man) == (False, [0])


def test_resume_rehashes_the_bytes_already_held(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(3000)
    man = manifest_of(data)
    first = cache.begin_upload(man, [0])
    first.write(0, 0, data[:1234])
    first.close()
    cached, held = cache.prepare(man)
    assert not cached and held == [1234]
    resumed = ModelCache(tmp_path / "c", CacheLimits()).begin_upload(man, held)
    resumed.write(0, 1234, data[1234:])
    assert resumed.finish().read_bytes() == data
    resumed.close()


def test_lru_eviction_spares_pinned_models(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits(quota_bytes=2500, max_model_bytes=2500))
    old, pinned = store_model(cache, os.urandom(1000)), store_model(cache, os.urandom(1000))
    os.utime(cache.model_dir(old), (1, 1))
    os.utime(cache.model_dir(pinned), (0, 0))
    cache.quota.pin(pinned)
    newest = store_model(cache, os.urandom(1000))
    assert cache.has(pinned) and cache.has(newest) and not cache.has(old)
    with pytest.raises(ResourceExhausted, match="model_cache_quota_bytes=2500"):
        cache.quota.pin(newest)
        store_model(cache, os.urandom(1000))
    cache.quota.unpin(pinned)
    cache.quota.unpin(newest)
    store_model(cache, os.urandom(1000))


def test_a_trailing_newline_is_not_part_of_a_valid_name_or_digest() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert manifest.valid_file_name("model.onnx") and manifest.valid_digest(digest)
    assert not manifest.valid_file_name("model.onnx\n") and not manifest.valid_digest(digest + "\n")


def test_partial_bytes_count_against_the_quota_and_a_stale_resume_is_aborted(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits(quota_bytes=2500, max_model_bytes=2500))
    abandoned = os.urandom(1500)
    man = manifest_of(abandoned)
    upload = cache.begin_upload(man, [0])
    upload.write(0, 0, abandoned[:1000])
    upload.close()
    assert cache.prepare(man) == (False, [1000])
    store_model(cache, os.urandom(2000))  # 1000 held + 2000 > 2500: the abandoned bytes make room
    assert cache.prepare(man) == (False, [0])
    with pytest.raises(Aborted, match="no longer holds"):
        cache.begin_upload(man, [1000])
    assert store_model(cache, abandoned) == man.digest  # nothing was left claimed


def _send(upload: Upload, chunks: list[tuple[int, int, bytes]]) -> None:
    for index, offset, data in chunks:
        upload.write(index, offset, data)


def _chunked(data: bytes, size: int, index: int = 0, start: int = 0) -> list[tuple[int, int, bytes]]:
    return [(index, o, data[o : o + size]) for o in range(start, len(data), size)]


def two_file_manifest(a: bytes, b: bytes) -> rknn_pb2.ModelManifest:
    entries = [
        manifest.FileEntry(n, len(d), hashlib.sha256(d).hexdigest()) for n, d in (("m.onnx", a), ("w.bin", b))
    ]
    return rknn_pb2.ModelManifest(
        digest=manifest.manifest_digest(entries),
        files=[rknn_pb2.ModelFile(name=e.name, size=e.size, sha256=e.sha256) for e in entries],
    )


def test_a_corrupt_chunk_in_a_later_block_still_fails_verification(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(2 * BLOCK_BYTES + 12345)
    man = manifest_of(data)
    chunks = _chunked(data, 1 << 20)
    index, offset, bad = chunks[5]  # inside the second block
    chunks[5] = (index, offset, bytes([bad[0] ^ 1]) + bad[1:])
    upload = cache.begin_upload(man, [0])
    _send(upload, chunks)
    with pytest.raises(DataLoss, match=r"m\.onnx"):
        upload.finish()
    upload.close()
    assert not cache.has(man.digest) and cache.prepare(man) == (False, [0])


def test_chunks_of_two_files_interleaved_in_one_block_land_in_their_files(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    a, b = os.urandom(300_000), os.urandom(200_000)
    man = two_file_manifest(a, b)
    upload = cache.begin_upload(man, [0, 0])
    interleaved = [
        c for pair in zip(_chunked(a, 100_000), _chunked(b, 100_000, 1), strict=False) for c in pair
    ]
    _send(upload, [*interleaved, *_chunked(a, 100_000)[2:]])
    main = upload.finish()
    upload.close()
    assert main.read_bytes() == a and (main.parent / "w.bin").read_bytes() == b


def test_tiny_chunks_are_stored_in_order(tmp_path: Path) -> None:
    """Many more chunks than one writev takes: the block is split, every byte lands in order."""
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(3 * 1024 + 7)
    man = manifest_of(data)
    upload = cache.begin_upload(man, [0])
    _send(upload, _chunked(data, 1))
    assert upload.finish().read_bytes() == data
    upload.close()


def test_chunks_gathered_but_not_yet_written_are_kept_for_resume(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(BLOCK_BYTES + (3 << 20))
    man = manifest_of(data)
    first = cache.begin_upload(man, [0])
    _send(first, _chunked(data[: BLOCK_BYTES + (1 << 20)], 1 << 20))  # one block stored, one chunk gathered
    first.close()
    assert cache.prepare(man) == (False, [BLOCK_BYTES + (1 << 20)])
    resumed = cache.begin_upload(man, [BLOCK_BYTES + (1 << 20)])
    _send(resumed, _chunked(data, 1 << 20, start=BLOCK_BYTES + (1 << 20)))
    assert resumed.finish().read_bytes() == data
    resumed.close()


def _open_under(folder: Path) -> list[str]:
    """Paths under `folder` this process holds open."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
    return [t for t in targets if t.startswith(str(folder))]


def test_only_files_still_being_written_are_held_open(tmp_path: Path) -> None:
    """A model of many files keeps open only those in progress, not one handle per file it ever wrote."""
    cache = ModelCache(tmp_path / "c", CacheLimits())
    a, b = os.urandom(BLOCK_BYTES), os.urandom(2 * BLOCK_BYTES)
    man = two_file_manifest(a, b)
    upload = cache.begin_upload(man, [0, 0])
    _send(upload, [*_chunked(a, 1 << 20), *_chunked(b[:BLOCK_BYTES], 1 << 20, 1)])
    partial = cache.partial_dir(man.digest)
    assert sorted({Path(t).name for t in _open_under(partial)}) == ["w.bin"]
    _send(upload, _chunked(b, 1 << 20, 1, start=BLOCK_BYTES))
    upload.finish()
    upload.close()
    cache.close()  # the model made durable: the syncer's handles are closed too
    assert _open_under(tmp_path) == []


def test_each_request_checks_its_manifest_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload's begin (which also asks what the cache holds) and a whole model's adoption each
    validate the manifest once: the steps after the first take the checked one."""
    from rknn_server.store import model_cache

    checks: list[str] = []
    real = model_cache.validate_manifest

    def counted(wire: rknn_pb2.ModelManifest, limits: CacheLimits) -> model_cache.CheckedManifest:
        checks.append(wire.digest)
        return real(wire, limits)

    monkeypatch.setattr(model_cache, "validate_manifest", counted)
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(100)
    man = manifest_of(data)
    upload = cache.begin_upload(man, [0])
    upload.close()
    assert checks == [man.digest]
    staged = tmp_path / "whole.onnx"
    staged.write_bytes(data)
    checks.clear()
    cache.adopt(man, staged, "uid:1000")
    assert checks == [man.digest] and cache.main_file(man.digest, "uid:1000").read_bytes() == data
