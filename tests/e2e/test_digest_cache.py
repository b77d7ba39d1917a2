"""The client's digest cache: an unchanged file is not hashed again, even by a new client process;
any change to the file (content, times, inode) means hashing it again."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rknn_client import connect, digest_cache
from rknn_client.digest_cache import MIN_FILE_BYTES, DigestCache
from rknn_server.testing import DaemonProcess


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default place, under the user's cache folder (the suite's own file override is lifted)."""
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.delenv(digest_cache.PATH_ENV, raising=False)
    return home


def _model(path: Path, fill: int = 1) -> Path:
    path.write_bytes(bytes([fill]) * (MIN_FILE_BYTES + 17))
    return path


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path, progress: object = None) -> str:
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(digest_cache, "file_sha256", refuse)


def test_a_digest_survives_a_new_client_process_and_is_trusted_while_unchanged(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tmp_path / "m.rknn")
    script = "import sys; from pathlib import Path; from rknn_client.digest_cache import DigestCache; print(DigestCache().sha256(Path(sys.argv[1])))"
    out = subprocess.run(
        [sys.executable, "-c", script, str(model)], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == hashlib.sha256(model.read_bytes()).hexdigest()
    assert (cache_home / "rknn_client" / "digests.json").is_file()
    _no_hashing(monkeypatch)
    heard: list[int] = []
    assert DigestCache().sha256(model, heard.append) == out.stdout.strip()
    assert heard == [model.stat().st_size]  # the progress display still sees the whole file


def test_a_file_changed_in_place_with_the_same_size_is_hashed_again(tmp_path: Path, cache_home: Path) -> None:
    model = _model(tmp_path / "m.rknn")
    before = DigestCache().sha256(model)
    with model.open("r+b") as fh:  # same size, new bytes, a new mtime
        fh.write(b"\x02")
    assert DigestCache().sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest() != before


def test_a_change_hidden_behind_a_restored_mtime_is_hashed_again(tmp_path: Path, cache_home: Path) -> None:
    model = _model(tmp_path / "m.rknn")
    stat = model.stat()
    before = DigestCache().sha256(model)
    with model.open("r+b") as fh:
        fh.write(b"\x02")
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as cp -p or rsync -t would
    assert model.stat().st_mtime_ns == stat.st_mtime_ns
    assert DigestCache().sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest() != before


def test_a_file_replaced_by_another_is_hashed_again(tmp_path: Path, cache_home: Path) -> None:
    model = _model(tmp_path / "m.rknn")
    stat = model.stat()
    before = DigestCache().sha256(model)
    other = _model(tmp_path / "other", fill=3)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, model)
    assert DigestCache().sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest() != before


def test_an_unreadable_cache_file_only_means_hashing(tmp_path: Path, cache_home: Path) -> None:
    model = _model(tmp_path / "m.rknn")
    (cache_home / "rknn_client").mkdir(parents=True)
    (cache_home / "rknn_client" / "digests.json").write_text("{not json")
    assert DigestCache().sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert str(model.resolve()) in json.loads((cache_home / "rknn_client" / "digests.json").read_text())


def test_the_cache_keeps_only_the_latest_entries(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digest_cache, "MAX_ENTRIES", 3)
    models = [_model(tmp_path / f"m{i}.rknn", fill=i) for i in range(5)]
    for m in models:
        DigestCache().sha256(m)
    kept = json.loads((cache_home / "rknn_client" / "digests.json").read_text())
    assert sorted(kept) == sorted(str(m.resolve()) for m in models[2:])
    assert not [
        p for p in (cache_home / "rknn_client").iterdir() if p.name != "digests.json"
    ]  # no temp files left


def test_uploading_an_unchanged_model_again_skips_hashing_it(
    tmp_path: Path, cache_home: Path, host_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "blob.rknn"
    model.write_bytes(os.urandom(MIN_FILE_BYTES + 4096))
    with connect(host_daemon.url) as device:
        first = device.upload(model)
    assert not first.cached and first.sent_bytes == model.stat().st_size
    _no_hashing(monkeypatch)
    hashed: list[tuple[int, int]] = []
    with connect(host_daemon.url) as device:
        again = device.upload(model, hashing=lambda done, total: hashed.append((done, total)))
    assert again.cached and again.digest == first.digest
    assert hashed[-1] == (model.stat().st_size, model.stat().st_size)
