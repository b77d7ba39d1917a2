"""Dynamic-shape models over the toolkit's protocol: MODEL_INFO gives the runtime's declared dims,
INPUT_DYNAMIC_RANGE its shapes, and MsgSetInputShape (command 16, answered by 17) switches the runtime
to the shape of the next inputs, as Rockchip's rknn_server does."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.adb.fixtures import PrivateAdbServer
from tests.legacy.conftest import RESTARTS_LOG, LegacyDaemon, LegacyDaemonFactory
from tests.legacy.toolkit import Toolkit, export_tiny_rknn, find_toolkit, run_on_board
from tests.legacy.wire_client import (
    FINISH,
    IOCTL_ACK,
    LOAD_ACK,
    NHWC,
    SET_INPUT_SHAPE_ACK,
    WireClient,
    attrs,
    finish_outputs,
)
from tests.rknnrt.stub_build import StubTensor, write_stub_model

SMALL, BIG = (1, 8, 8, 3), (1, 16, 16, 3)  # NHWC, as the runtime describes them
# The toolkit's config(dynamic_input=...): the same two shapes, NCHW.
DYNAMIC_INPUT = [[[1, 3, 8, 8]], [[1, 3, 16, 16]]]
DYNAMIC_RANGE_BYTES = 4228852
ACK_INVALID_DYNAMIC_INPUT_RANGE = 10
FP32 = 0


def dynamic_model(path: Path, container: bytes = b"") -> Path:
    """The stand-in's y = 2x + 1 whose input takes SMALL and BIG (its input attribute gives the last,
    BIG, as the dims it declares); the output follows the input's shape."""
    return write_stub_model(
        path,
        inputs=[StubTensor("x", "FP32", "NHWC", SMALL)],
        outputs=[StubTensor("y", "FP32", "NHWC", SMALL)],
        dynamic=[SMALL, BIG],
        container=container,
    )


def w_strides(data: bytes) -> tuple[int, int]:
    """The w_stride of the first input's and first output's attribute in a MsgSetInputShape ack."""
    return (
        struct.unpack_from("<I", data, 0x74 + 0x15C)[0],
        struct.unpack_from("<I", data, 0xB4F8 + 0x15C)[0],
    )


def ramp(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


@pytest.fixture
def daemon(legacy_daemon: LegacyDaemonFactory) -> LegacyDaemon:
    return legacy_daemon("--log-level", "debug")


def loaded(daemon: LegacyDaemon, model: Path) -> WireClient:
    client = WireClient(daemon.address)
    assert client.open() == 0
    assert client.load(model.read_bytes()).command == LOAD_ACK and client.context >= 1
    return client


def run(client: WireClient, x: np.ndarray) -> np.ndarray:
    client.set_inputs([x])
    finish = client.run()
    assert (finish.command, struct.unpack_from("<I", finish.data, 0x74)[0]) == (FINISH, 0)
    (output,) = finish_outputs(finish, [np.dtype(np.float32)])
    return output


def test_model_info_and_dynamic_range_describe_what_the_runtime_declares(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    client = loaded(daemon, dynamic_model(tmp_path / "d.rknn"))
    info = client.ioctl(0)
    assert (info.command, info.ack) == (IOCTL_ACK, 0)
    # The input's record: the dims RKNN_QUERY_INPUT_ATTR gives, never 0 for a free dimension.
    assert info.data[0x80 + 0x100] == 4
    assert struct.unpack_from("<4I", info.data, 0x80 + 0x101) == BIG
    ranges = client.ioctl(7)
    assert struct.unpack_from("<IIQ", ranges.data, 0x6C) == (0, 7, DYNAMIC_RANGE_BYTES)
    assert len(ranges.data) == 0x7C + DYNAMIC_RANGE_BYTES + 1
    # n_input and the dynamic flag the client reads, then the input's record (rknn_input_range, packed).
    assert struct.unpack_from("<II", ranges.data, 0xE8) == (1, 1)
    record = 0xF0
    assert struct.unpack_from("<II", ranges.data, record) == (0, 2)  # index, shape_number
    assert ranges.data[record + 8] == NHWC
    assert struct.unpack_from("<I", ranges.data, record + 9)[0] == 4
    assert struct.unpack_from("<4I", ranges.data, record + 0xD) == SMALL
    assert struct.unpack_from("<4I", ranges.data, record + 0xD + 64) == BIG
    assert ranges.data[record + 0x800D : record + 0x800F] == b"x\0"
    client.close()


def test_a_static_model_says_it_is_static_and_refuses_other_shapes(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    tensors = {
        "inputs": [StubTensor("x", "FP32", "NHWC", SMALL)],
        "outputs": [StubTensor("y", "FP32", "NHWC", SMALL)],
    }
    static = write_stub_model(tmp_path / "s.rknn", **tensors)
    client = loaded(daemon, static)
    ranges = client.ioctl(7)
    assert struct.unpack_from("<II", ranges.data, 0xE8) == (1, 0)
    assert struct.unpack_from("<I", ranges.data, 0xF0 + 4)[0] == 0  # no shapes
    refused = client.set_input_shapes([BIG])
    assert (refused.command, refused.ack) == (SET_INPUT_SHAPE_ACK, ACK_INVALID_DYNAMIC_INPUT_RANGE)
    np.testing.assert_array_equal(run(client, ramp(SMALL)), 2 * ramp(SMALL).ravel() + 1)
    client.close()


def test_set_input_shape_switches_the_runtime_and_answers_the_attributes_at_that_shape(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    client = loaded(daemon, dynamic_model(tmp_path / "d.rknn"))
    # Before any shape is set, inputs of the declared shape run.
    big, small = ramp(BIG), ramp(SMALL)
    np.testing.assert_array_equal(run(client, big), 2 * big.ravel() + 1)
    answer = client.set_input_shapes([SMALL])
    assert (answer.command, answer.ack, len(answer.data)) == (SET_INPUT_SHAPE_ACK, 0, 0x16978)
    assert answer.context == client.context
    (x,) = attrs(answer.data, 0x70)
    assert (x.index, x.dims, x.name, x.n_elems, x.size, x.fmt, x.type) == (
        0,
        SMALL,
        "x",
        192,
        768,
        NHWC,
        FP32,
    )
    (y,) = attrs(answer.data, 0xB4F4)
    assert (y.dims, y.name, y.n_elems, y.size) == (SMALL, "y", 192, 768)
    # w_stride as the runtime gives it at that shape (the stand-in: the width), as Rockchip's server
    # sends it; the toolkit sends it back in its next MsgSetInputShape.
    assert w_strides(answer.data) == (8, 8)
    np.testing.assert_array_equal(run(client, small), 2 * small.ravel() + 1)
    # A shape the model does not take: ack 10 with the attributes that were sent; the runtime stays.
    odd = (1, 12, 12, 3)
    refused = client.set_input_shapes([odd])
    assert (refused.command, refused.ack) == (SET_INPUT_SHAPE_ACK, ACK_INVALID_DYNAMIC_INPUT_RANGE)
    assert [a.dims for a in attrs(refused.data, 0x70)] == [odd]
    assert [a.dims for a in attrs(refused.data, 0xB4F4)] == [SMALL]
    np.testing.assert_array_equal(run(client, small), 2 * small.ravel() + 1)
    # Back to the big shape.
    answer = client.set_input_shapes([BIG])
    assert (answer.ack, w_strides(answer.data)) == (0, (16, 16))
    np.testing.assert_array_equal(run(client, big), 2 * big.ravel() + 1)
    client.close()
    daemon.process.stop()
    assert "legacy_input_shapes_refused" in daemon.process.log_text()


SCRIPT = """
import json
import sys
import numpy as np
from rknn.api import RKNN

model, device, out = sys.argv[1:4]
rknn = RKNN(verbose=True)
assert rknn.load_rknn(model) == 0
assert rknn.init_runtime(target="rk3588", device_id=device) == 0
results = {}
for hw in (8, 16, 8):
    x = np.arange(hw * hw * 3, dtype=np.float32).reshape(1, hw, hw, 3)
    outs = rknn.inference(inputs=[x])
    results[f"{hw}-{len(results)}"] = outs[0].ravel().tolist()
rknn.release()
json.dump(results, open(out, "w"))
"""


@pytest.fixture(scope="session")
def real_dynamic_rknn(toolkit: Toolkit, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dynamic-shape .rknn from the real converter (config(dynamic_input=DYNAMIC_INPUT))."""
    return export_tiny_rknn(toolkit, tmp_path_factory.mktemp("dynamic-rknn"), DYNAMIC_INPUT)


@pytest.mark.parametrize("version", ["2.5.0", "2.3.2"])
def test_the_unmodified_toolkit_runs_a_dynamic_rknn_at_two_input_sizes(
    version: str,
    toolkit_adb: PrivateAdbServer,
    real_dynamic_rknn: Path,
    legacy_daemon: LegacyDaemonFactory,
    board_for,
    tmp_path: Path,
) -> None:
    """The toolkit sends MsgSetInputShape before each inference (INPUT_DYNAMIC_RANGE says the model is
    dynamic), takes the sizes of the ack's attributes and gets the stand-in's exact outputs; nothing
    gives it a reason to restart the board's daemon."""
    toolkit = find_toolkit(version)
    if toolkit is None:
        pytest.skip(f"no RKNN-Toolkit2 {version} venv (rknn-client toolkit install --version {version})")
    daemon = legacy_daemon("--log-level", "debug")
    board = board_for(daemon)
    pid = daemon.process.pid
    model = dynamic_model(tmp_path / "dynamic.rknn", real_dynamic_rknn.read_bytes())
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "outputs.json"
    done = run_on_board(toolkit, script, [str(model), board.serial, str(out)], toolkit_adb.env, tmp_path)
    detail = done.stdout[-3000:] + done.stderr[-3000:] + daemon.process.log_text()[-3000:]
    assert done.returncode == 0, detail
    assert "expected input len is 0" not in done.stdout and "Catch runtime Crash" not in done.stdout
    assert "static model, can not set input shape" not in done.stdout
    outputs = json.loads(out.read_text())
    for key, values in outputs.items():
        hw = int(key.split("-")[0])
        np.testing.assert_array_equal(np.asarray(values, np.float32), 2 * ramp((1, hw, hw, 3)).ravel() + 1)
    assert list(outputs) == ["8-0", "16-1", "8-2"]
    assert not (daemon.board / RESTARTS_LOG).exists(), (daemon.board / RESTARTS_LOG).read_text()
    assert daemon.process.pid == pid and Path(f"/proc/{pid}").exists()
    daemon.process.stop()
    shapes = [
        json.loads(line)
        for line in daemon.process.log_text().splitlines()
        if '"legacy.SET_INPUT_SHAPE"' in line
    ]
    assert [entry["outcome"] for entry in shapes] == ["OK"] * 3
