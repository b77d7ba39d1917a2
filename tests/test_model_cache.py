"""The model cache on its own: verified commits, resume, LRU eviction that spares pinned models."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from rknn_proto import manifest, rknn_pb2
from rknn_server.errors import Aborted, DataLoss, NotFound, ResourceExhausted
from rknn_server.model_cache import CacheLimits, ModelCache


def manifest_of(data: bytes, name: str = "m.onnx") -> rknn_pb2.ModelManifest:
    entry = manifest.FileEntry(name, len(data), hashlib.sha256(data).hexdigest())
    return rknn_pb2.ModelManifest(
        digest=manifest.manifest_digest([entry]),
        files=[rknn_pb2.ModelFile(name=name, size=entry.size, sha256=entry.sha256)],
    )


def store(cache: ModelCache, data: bytes) -> str:
    man = manifest_of(data)
    upload = cache.begin_upload(man, [0])
    try:
        upload.write(0, 0, data)
        upload.finish()
    finally:
        upload.close()
    return man.digest


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
    old, pinned = store(cache, os.urandom(1000)), store(cache, os.urandom(1000))
    os.utime(cache.model_dir(old), (1, 1))
    os.utime(cache.model_dir(pinned), (0, 0))
    cache.pin(pinned)
    newest = store(cache, os.urandom(1000))
    assert cache.has(pinned) and cache.has(newest) and not cache.has(old)
    with pytest.raises(ResourceExhausted, match="model_cache_quota_bytes=2500"):
        cache.pin(newest)
        store(cache, os.urandom(1000))
    cache.unpin(pinned)
    cache.unpin(newest)
    store(cache, os.urandom(1000))


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
    store(cache, os.urandom(2000))  # 1000 held + 2000 > 2500: the abandoned bytes make room
    assert cache.prepare(man) == (False, [0])
    with pytest.raises(Aborted, match="no longer holds"):
        cache.begin_upload(man, [1000])
    assert store(cache, abandoned) == man.digest  # nothing was left claimed
