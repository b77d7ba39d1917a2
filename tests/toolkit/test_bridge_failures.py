"""Bad input through the bridge: no toolkit, a worker that dies or hangs, models the toolkit refuses.
Each ends in a clear error within bounded time, never a hang or an exception."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from rknn_client.cli import main as cli_main
from rknn_client.toolkit import Missing, Reply, Toolkit, ToolkitBridge
from rknn_client.toolkit.locate import ENV_PYTHON
from tests.toolkit.conftest import SIZE, start


def test_a_missing_toolkit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nowhere = tmp_path / "no-such-venv" / "bin" / "python"
    monkeypatch.setenv(ENV_PYTHON, str(nowhere))
    started = ToolkitBridge.start()
    assert isinstance(started, Missing)
    assert str(nowhere) in started.message()
    assert "rknn-client toolkit install" in started.message()


def test_a_python_without_the_toolkit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PYTHON, sys.executable)
    started = ToolkitBridge.start()
    assert isinstance(started, Missing)
    assert "has no rknn-toolkit2 installed" in started.reason


def test_status_says_why_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_PYTHON, str(tmp_path / "python"))
    assert cli_main(["toolkit", "status"]) == 1
    out = capsys.readouterr().out
    assert "not found" in out and str(tmp_path / "python") in out and "rknn-client toolkit install" in out


def test_status_reports_the_toolkit_found(toolkit: Toolkit, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["toolkit", "status", "--json"]) == 0
    out = capsys.readouterr().out
    assert f'"version": "{toolkit.version}"' in out and str(toolkit.python) in out


def test_a_worker_killed_mid_call_is_an_error_not_a_hang(toolkit: Toolkit, classifier) -> None:
    model, dataset, _ = classifier
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        assert bridge.call("load_onnx", str(model)).value == 0
        replies: list[Reply] = []
        caller = threading.Thread(
            target=lambda: replies.append(bridge.call("build", do_quantization=True, dataset=str(dataset)))
        )
        caller.start()
        deadline = time.monotonic() + 30
        while not bridge._lock.locked() and time.monotonic() < deadline:  # the request is on its way
            time.sleep(0.001)
        os.kill(bridge.process.pid, signal.SIGKILL)
        began = time.monotonic()
        caller.join(timeout=60)
        assert not caller.is_alive()
        assert time.monotonic() - began < 30
        (reply,) = replies
        assert not reply.ok
        assert "build" in reply.error and "signal 9" in reply.error
        assert "rknn-client toolkit install" in reply.error
        after = bridge.call("export_rknn", "never.rknn")
        assert not after.ok and "RKNN state is lost" in after.error
    finally:
        bridge.close()


def test_a_call_past_its_timeout_stops_the_worker(toolkit: Toolkit, classifier) -> None:
    model, dataset, _ = classifier
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        assert bridge.call("load_onnx", str(model)).value == 0
        reply = bridge.call("build", do_quantization=True, dataset=str(dataset), timeout_s=0.05)
        assert not reply.ok and "no answer within 0.05s" in reply.error
        assert not bridge.alive
    finally:
        bridge.close()


CLIENT = """
import sys
from rknn_client.toolkit import ToolkitBridge
bridge = ToolkitBridge.start()
print(bridge.process.pid, flush=True)
if len(sys.argv) > 1:
    bridge.call("config", target_platform="rk3588")
    bridge.call("load_onnx", sys.argv[1])
    bridge.call("build", do_quantization=True, dataset=sys.argv[2])
sys.stdin.read()
"""


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_the_worker_dies_with_its_client(toolkit: Toolkit, classifier, tmp_path: Path, busy: bool) -> None:
    """Idle, the worker sees its request pipe close; busy in a call (here: build blocked reading a
    dataset FIFO that never gets data), its watchdog sees its parent gone."""
    model, _, _ = classifier
    fifo = tmp_path / "dataset.txt"
    os.mkfifo(fifo)
    argv = [sys.executable, "-c", CLIENT] + ([str(model), str(fifo)] if busy else [])
    env = {**os.environ, ENV_PYTHON: str(toolkit.python)}
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    worker, writer = 0, -1
    try:
        assert client.stdout is not None
        worker = int(client.stdout.readline())
        deadline = time.monotonic() + 120
        while busy and writer < 0 and time.monotonic() < deadline:
            try:  # succeeds once the worker is inside build(), opening the FIFO to read it
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.05)
        assert writer >= 0 or not busy, "the worker never reached the dataset"
        os.kill(client.pid, signal.SIGKILL)
        client.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker), "the worker outlived its client"
    finally:
        if writer >= 0:
            os.close(writer)
        if client.poll() is None:
            client.kill()
            client.wait()
        if worker and _running(worker):
            os.kill(worker, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphaned worker is reaped by init, not by us)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_model_the_toolkit_refuses_gives_its_own_reason(
    toolkit: Toolkit, classifier, tmp_path: Path
) -> None:
    model, _, _ = classifier
    dynamic = onnx.load(str(model))
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(dynamic, str(tmp_path / "dynamic.onnx"))
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        reply = bridge.call("load_onnx", str(tmp_path / "dynamic.onnx"))
    finally:
        bridge.close()
    assert not reply.ok
    assert reply.error.startswith(
        "ValueError: The input shape ['batch', 3, 32, 32] of 'input' is not support!"
    )
    assert "input_size_list" in reply.error and "Traceback" not in reply.error
    assert any("is not support" in text for _, text in reply.lines), reply.lines


def test_an_exception_in_the_toolkit_comes_back_as_an_error(
    toolkit: Toolkit, classifier, tmp_path: Path
) -> None:
    """The toolkit raises (instead of returning -1) on NHWC calibration files: the reply carries its reason."""
    model, _, _ = classifier
    np.save(tmp_path / "nhwc.npy", np.zeros((1, SIZE, SIZE, 3), np.float32))
    (tmp_path / "dataset.txt").write_text(f"{tmp_path / 'nhwc.npy'}\n")
    bridge = start(toolkit)
    try:
        assert bridge.call("config", target_platform="rk3588").value == 0
        assert bridge.call("load_onnx", str(model)).value == 0
        reply = bridge.call("build", do_quantization=True, dataset=str(tmp_path / "dataset.txt"))
        assert bridge.alive
    finally:
        bridge.close()
    assert not reply.ok
    assert "shape (1, 32, 32, 3) is wrong, expect 'nchw'" in reply.error, reply.error


def test_unknown_methods_and_unsendable_arguments_are_refused(toolkit: Toolkit) -> None:
    bridge = start(toolkit)
    try:
        unknown = bridge.call("__class__")
        assert not unknown.ok and "no method" in unknown.error
        unsendable = bridge.call("config", mean_values=object())
        assert not unsendable.ok and "cannot cross to the toolkit" in unsendable.error
        assert bridge.call("config", target_platform="rk3588").value == 0
    finally:
        bridge.close()


def test_a_toolkit_that_cannot_start_is_missing_with_the_reason(
    toolkit: Toolkit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interpreter that answers the version probe but whose worker dies before it is ready
    (as when torch's CUDA libraries are missing): the start reports that, with the install hint."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *worker.py*) echo "OSError: libcublas.so.12: cannot open shared object file" >&2; exit 7;; esac\n'
        f'exec "{toolkit.python}" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv(ENV_PYTHON, str(wrapper))
    started = ToolkitBridge.start()
    assert isinstance(started, Missing), started
    assert "while importing rknn.api (exit status 7): OSError: libcublas.so.12" in started.reason
    assert "rknn-client toolkit install" in started.message()


def test_every_loader_refuses_a_corrupt_file_and_the_worker_keeps_serving(
    toolkit: Toolkit, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00garbage, not a model\xff" * 64)
    loaders: list[tuple[str, list[object], dict[str, object]]] = [
        ("load_onnx", [str(junk)], {}),
        ("load_tflite", [str(junk)], {}),
        ("load_caffe", [str(junk), str(junk)], {}),
        ("load_darknet", [str(junk), str(junk)], {}),
        ("load_tensorflow", [str(junk), ["input"], [[1, 3, 8, 8]], ["output"]], {}),
    ]
    bridge = start(toolkit)
    try:
        for method, args, kwargs in loaders:
            assert bridge.call("config", target_platform="rk3588").value == 0
            reply = bridge.call(method, *args, **kwargs)
            said = reply.error + "".join(text for _, text in reply.lines)
            assert not reply.ok or reply.value == -1, (method, reply)
            assert f"{method}: " in said, (method, said)  # the toolkit names the failing call
            assert bridge.alive, method
    finally:
        bridge.close()


FAKE_WORKER = """
import json, os, sys
requests, replies = os.fdopen(int(sys.argv[-3])), os.fdopen(int(sys.argv[-2]), "w")
replies.write(json.dumps({"ready": True}) + "\\n"); replies.flush()
for line in requests:
    request = json.loads(line)
    call = request["id"]
    for stream in (sys.stdout, sys.stderr):
        stream.write("\\x1erknn-bridge-sync %d\\n" % call); stream.flush()
    value = 0 if request["method"] in ("new", "release") else {"$ndarray": os.environ["VICTIM"]}
    replies.write(json.dumps({"id": call, "ok": True, "value": value}) + "\\n")
    replies.flush()
"""


def test_result_files_outside_the_scratch_dir_are_neither_read_nor_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that names someone else's file as its result (a bug, or a hostile interpreter) gets
    an error; the file is left alone."""
    victim = tmp_path / "victim.npy"
    np.save(victim, np.arange(3))
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("VICTIM", str(victim))
    fake = Toolkit(python=wrapper, version="2.5.0", python_version="3", source="test", torch="missing")
    bridge = ToolkitBridge.start(fake)
    assert isinstance(bridge, ToolkitBridge), bridge
    try:
        reply = bridge.call("inference", inputs=[np.zeros(2)])
    finally:
        bridge.close()
    assert not reply.ok and "outside its scratch dir" in reply.error
    np.testing.assert_array_equal(np.load(victim), np.arange(3))
