"""A committed model made durable in the background: trusted from what it verified on arrival until
its files are synced, its record written only after that, removed if they cannot be synced."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

import pytest

from rknn_proto import manifest
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import DataLoss
from rknn_server.store import verification
from rknn_server.store.cache_records import RECORD_FILE, read_record
from rknn_server.store.model_cache import ModelCache
from tests.unit.server.fakes import store_model


class HeldSync:
    """Syncs wait for `release`; the paths synced are listed."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.synced: list[Path] = []


@pytest.fixture
def held_sync(monkeypatch: pytest.MonkeyPatch) -> HeldSync:
    held = HeldSync()
    real = verification.sync_path

    def sync(path: Path) -> None:
        assert held.release.wait(30)
        held.synced.append(path)
        real(path)

    monkeypatch.setattr(verification, "sync_path", sync)
    return held


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> str:
        raise AssertionError(f"hashed {path.name} again")

    monkeypatch.setattr(verification, "file_sha256", refuse)


def test_the_record_follows_the_sync_and_the_model_is_trusted_meanwhile(
    tmp_path: Path, held_sync: HeldSync, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    digest = store_model(cache, os.urandom(5000))
    folder = cache.model_dir(digest)
    assert not (folder / RECORD_FILE).exists()  # not synced yet: no record that a restart would trust
    _no_hashing(monkeypatch)
    cache.verify(digest)  # what it verified on arrival stands in for the record
    held_sync.release.set()
    cache.close()
    assert folder / "m.onnx" in held_sync.synced and folder in held_sync.synced
    record = read_record(folder)
    assert record is not None and [f.name for f in record.files] == ["m.onnx"]
    ModelCache(tmp_path / "c", CacheLimits()).verify(digest)  # a restart trusts the record


def test_a_file_changed_before_its_record_is_hashed_again(tmp_path: Path, held_sync: HeldSync) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    digest = store_model(cache, os.urandom(5000))
    path = cache.main_file(digest)
    path.write_bytes(os.urandom(5000))  # same size, new bytes and mtime
    with pytest.raises(DataLoss):
        cache.verify(digest)
    assert not cache.has(digest)
    held_sync.release.set()
    cache.close()
    assert not cache.model_dir(digest).exists()


def test_a_model_that_cannot_be_synced_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(verification, "sync_path", failing)
    cache = ModelCache(tmp_path / "c", CacheLimits())
    digest = store_model(cache, os.urandom(5000))
    cache.close()
    assert not cache.has(digest) and not cache.model_dir(digest).exists()


def test_a_model_evicted_while_it_waits_for_its_sync_is_left_alone(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    cache = ModelCache(tmp_path / "c", CacheLimits())
    data = os.urandom(5000)
    digest = store_model(cache, data)
    shutil.rmtree(cache.model_dir(digest))
    held_sync.release.set()
    cache.close()
    assert not cache.model_dir(digest).exists()
    assert cache.prepare(manifest.one_file_manifest("m.onnx", data)) == (False, [0])


def test_a_model_left_without_its_record_is_hashed_again_after_a_restart(
    tmp_path: Path, held_sync: HeldSync
) -> None:
    """A power cut before the sync: the restarted cache trusts nothing, and a torn file is removed."""
    cache = ModelCache(tmp_path / "c", CacheLimits())
    digest = store_model(cache, os.urandom(5000))
    path = cache.main_file(digest)
    stat = path.stat()
    path.write_bytes(bytes(5000))  # the bytes the disk kept: zeros, same size and times
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    restarted = ModelCache(tmp_path / "c", CacheLimits())
    with pytest.raises(DataLoss):
        restarted.verify(digest)
    assert not restarted.has(digest)
    held_sync.release.set()
    cache.close()
    assert not (cache.model_dir(digest) / RECORD_FILE).exists()
