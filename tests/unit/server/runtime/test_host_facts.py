"""A model's facts kept beside it in the daemon's cache (host_facts): the next load of it parses no
graph and needs no onnx, and facts that do not match the file, or are not facts, are studied again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rknn_server.runtime import host_facts, host_study
from rknn_server.runtime.base import OverBudget, RuntimeOptions
from rknn_server.runtime.host import HostBackend
from tests.models import shape_input_bomb, small_cnn
from tests.throughput import models as throughput_models


def _studies(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths host_study reads from here on."""
    read: list[Path] = []
    real = host_study.read_model

    def counting(path: Path) -> object:
        read.append(path)
        return real(path)

    monkeypatch.setattr(host_study, "read_model", counting)
    return read


def _open_and_close(backend: HostBackend, model: Path, options: RuntimeOptions | None = None) -> object:
    runtime = backend.open(model, options or RuntimeOptions())
    x = np.full(tuple(runtime.inputs[0].shape), 0.5, runtime.inputs[0].dtype)
    out = runtime.run([x])[0].copy()
    runtime.close()
    return out


def test_a_model_studied_once_is_loaded_again_from_its_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = small_cnn(tmp_path / "cnn.onnx")
    read = _studies(monkeypatch)
    first = _open_and_close(HostBackend(threads=1, remember_facts=True), model)
    assert read == [model]
    studied = host_facts.recall(model)
    assert studied is not None and studied.weight_bytes > 0 and studied.steady
    again = _open_and_close(HostBackend(threads=1, remember_facts=True), model)  # as after a restart
    assert read == [model]  # not studied again
    assert np.array_equal(first, again)


def test_the_remembered_facts_still_decide_the_budget_and_the_arena(tmp_path: Path) -> None:
    cnn, bomb = small_cnn(tmp_path / "cnn.onnx"), shape_input_bomb(tmp_path / "bomb.onnx")
    for model in (cnn, bomb):
        runtime = HostBackend(threads=1, remember_facts=True).open(model, RuntimeOptions())
        runtime.close()
    backend = HostBackend(threads=1, remember_facts=True)
    with pytest.raises(OverBudget, match="max_session_memory=1000"):
        backend.open(cnn, RuntimeOptions(max_memory_bytes=1000))
    for model, arena in ((cnn, "1"), (bomb, "0")):
        runtime = backend.open(model, RuntimeOptions())
        options = runtime._model.session.get_session_options()  # type: ignore[attr-defined]
        assert str(int(options.enable_cpu_mem_arena)) == arena, model.name
        runtime.close()


def test_facts_that_do_not_fit_the_file_are_studied_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = small_cnn(tmp_path / "cnn.onnx")
    _open_and_close(HostBackend(threads=1, remember_facts=True), model)
    kept = host_facts.facts_path(model)
    good = json.loads(kept.read_text())
    read = _studies(monkeypatch)
    lies = {
        "another study version": {**good, "stamp": {**good["stamp"], "version": 0}},
        "a budget figure that is not a count": {**good, "facts": {**good["facts"], "need": -5}},
        "a figure missing": {**good, "facts": {"steady": True}},
        "not an object": [1, 2],
    }
    for what, text in {**{k: json.dumps(v) for k, v in lies.items()}, "not JSON": "{"}.items():
        kept.write_text(text)
        _open_and_close(HostBackend(threads=1, remember_facts=True), model)
        assert len(read) == 1, what
        assert json.loads(kept.read_text()) == good, what  # written anew
        read.clear()
    os.utime(model, ns=(0, 0))  # the file changed since
    _open_and_close(HostBackend(threads=1, remember_facts=True), model)
    assert read == [model]
    stamp = model.stat()
    shutil.copyfile(model, tmp_path / "copy.onnx")  # another file in its place, of the same size and time
    os.utime(tmp_path / "copy.onnx", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.replace(tmp_path / "copy.onnx", model)
    _open_and_close(HostBackend(threads=1, remember_facts=True), model)
    assert read == [model, model]


def test_only_the_daemons_backend_writes_beside_a_model_and_never_for_a_rewrite(tmp_path: Path) -> None:
    cnn = small_cnn(tmp_path / "cnn.onnx")
    _open_and_close(HostBackend(threads=1), cnn)  # a user's file, not the cache's
    assert not host_facts.facts_path(cnn).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["cnn.onnx"]
    # A QDQ model's outputs are exposed as int8: a graph rewritten at each load, so never from facts.
    floats = throughput_models.detector(tmp_path / "detector.onnx", size=64)
    qdq = throughput_models.quantized(floats, tmp_path / "qdq.onnx", throughput_models.random_images(2, 64))
    _open_and_close(HostBackend(threads=1, remember_facts=True), qdq)
    assert not host_facts.facts_path(qdq).exists()


def test_a_load_from_facts_imports_no_onnx(tmp_path: Path) -> None:
    model = small_cnn(tmp_path / "cnn.onnx")
    _open_and_close(HostBackend(threads=1, remember_facts=True), model)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from rknn_server.runtime.base import RuntimeOptions\n"
        "from rknn_server.runtime.host import HostBackend\n"
        f"HostBackend(threads=1, remember_facts=True).open(Path({str(model)!r}), RuntimeOptions()).close()\n"
        "print(sorted(m for m in sys.modules if m == 'onnx' or m.startswith('onnx.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
