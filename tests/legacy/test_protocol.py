"""The legacy protocol at the byte level against a live daemon: the messages, and every kind of bad
input (wrong magic, sizes beyond limits, truncated frames, hang-ups mid-load and mid-run, two clients)."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

import rknn_client
from tests.legacy.conftest import LegacyDaemon, LegacyDaemonFactory
from tests.legacy.wire_client import (
    ACK_FAIL,
    ACK_INVALD_INPUT,
    CRASH_BYTES,
    FINISH,
    HEADER,
    IOCTL_ACK,
    LOAD,
    LOAD_ACK,
    MULTI_INPUT,
    RUN,
    SET_INPUT_ACK,
    SET_INPUT_SHAPE,
    SET_INPUT_SHAPE_ACK,
    UNLOAD,
    UNLOAD_ACK,
    VERSION,
    VERSION_ACK,
    Reply,
    WireClient,
    finish_outputs,
    header,
)
from tests.metrics.conftest import metrics_base, samples, scrape
from tests.rknnrt.stub_build import StubTensor, write_stub_model

SHAPE = (1, 2, 2, 3)
MODEL_INFO_BYTES = 104985


def stub_model(path: Path, a: float = 2.0, b: float = 1.0) -> bytes:
    write_stub_model(
        path,
        inputs=[StubTensor("image", "FP32", "NHWC", SHAPE)],
        outputs=[StubTensor("score", "FP32", "NHWC", SHAPE)],
        a=a,
        b=b,
    )
    return path.read_bytes()


def connected(daemon: LegacyDaemon) -> WireClient:
    client = WireClient(daemon.address)
    assert client.open() == 0
    return client


def open_sessions(daemon: LegacyDaemon) -> int:
    with rknn_client.connect(daemon.url) as device:
        return device.info(refresh=True).open_sessions


def wait_for_sessions(daemon: LegacyDaemon, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := open_sessions(daemon)) != count:
        assert time.monotonic() < deadline, f"{seen} sessions open, expected {count}"
        time.sleep(0.05)


def run_once_reply(client: WireClient, x: np.ndarray) -> Reply:
    client.set_inputs([x])
    reply = client.run()
    assert (reply.command, struct.unpack_from("<I", reply.data, 0x74)[0]) == (FINISH, 0), reply.text()
    return reply


def run_once(client: WireClient, x: np.ndarray) -> np.ndarray:
    (output,) = finish_outputs(run_once_reply(client, x), [np.dtype(np.float32)])
    return output.reshape(SHAPE)


@pytest.fixture
def daemon(legacy_daemon: LegacyDaemonFactory) -> LegacyDaemon:
    return legacy_daemon("--max-message-bytes", str(1 << 20), "--log-level", "debug")


def test_a_whole_session_over_the_wire(daemon: LegacyDaemon, tmp_path: Path) -> None:
    client = connected(daemon)
    version = client.call(VERSION)
    assert (version.command, len(version.data), version.context) == (VERSION_ACK, 0x170, -1)
    assert version.text().startswith("rknn_server: 2.5.0 (rknn-server-oss")
    assert "\nrknnrt: 2.3.2" in version.text()
    load = client.load(stub_model(tmp_path / "m.rknn"))
    assert (load.command, len(load.data), load.ack) == (LOAD_ACK, 0x170, 0)
    assert load.context >= 1  # the server-assigned context id, carried by every later request
    info = client.ioctl(0)
    assert (info.command, info.context) == (IOCTL_ACK, load.context)
    assert struct.unpack_from("<IIQ", info.data, 0x6C) == (0, 0, MODEL_INFO_BYTES)
    assert len(info.data) == 0x7C + MODEL_INFO_BYTES + 1  # every ioctl ack ends with one more byte
    assert struct.unpack_from("<I", info.data, 0x7C)[0] == 1
    assert info.data[0x80:0x86] == b"image\0"
    assert info.data[0x80 + 0x100] == 4
    assert struct.unpack_from("<4I", info.data, 0x80 + 0x101) == SHAPE
    assert tuple(info.data[0x80 + 0x141 : 0x80 + 0x143]) == (1, 0)  # NHWC, FP32
    # w_stride as the runtime gives it (the stand-in: the width) and size_with_stride (12 float32) at
    # +0x14d and +0x151, as Rockchip's server fills them.
    assert struct.unpack_from("<II", info.data, 0x80 + 0x14D) == (SHAPE[2], 48)
    assert struct.unpack_from("<I", info.data, 0xAD91)[0] == 1
    assert info.data[0xAD95:0xAD9B] == b"score\0"
    dynamic_range = client.ioctl(7)
    assert len(dynamic_range.data) == 0x7C + 4228852 + 1
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    client.set_inputs([x])
    finish = client.run()
    assert struct.unpack_from("<QI", finish.data, 0x6C) == (0, 0)  # frame ids start at 0, result 0
    np.testing.assert_array_equal(finish_outputs(finish, [np.dtype(np.float32)])[0].reshape(SHAPE), 2 * x + 1)
    assert struct.unpack_from("<Q", run_once_reply(client, x).data, 0x6C)[0] == 1
    assert open_sessions(daemon) == 1
    unload = client.call(UNLOAD)
    assert (unload.command, len(unload.data), unload.ack) == (UNLOAD_ACK, 0x70, 0)
    assert open_sessions(daemon) == 0
    # The toolkit's reader thread returns only when the daemon hangs up after the unload.
    with pytest.raises(EOFError):
        client.reply()
    client.close()


def test_queries_after_a_run_answer_in_the_reader_thread_layout(daemon: LegacyDaemon, tmp_path: Path) -> None:
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    run_once(client, np.zeros(SHAPE, np.float32))
    # PERF_RUN: data length 8, the last run's duration in microseconds at 0x7c, one more byte.
    perf_run = client.ioctl(2)
    assert struct.unpack_from("<IIQ", perf_run.data, 0x6C) == (0, 2, 8)
    assert len(perf_run.data) == 0x7C + 8 + 1
    assert 0 < struct.unpack_from("<Q", perf_run.data, 0x7C)[0] < 10_000_000
    # MEMORY_DETAIL: data length 1033 = u64 1024, then a 1 KiB text buffer and a NUL.
    memory = client.ioctl(3)
    assert struct.unpack_from("<IIQQ", memory.data, 0x6C) == (0, 3, 1033, 1024)
    assert len(memory.data) == 0x7C + 1033 + 1
    assert memory.text(0x84).splitlines() == [
        "Total Weight Memory  : 1024",  # two spaces, as the real server writes it
        "Total Internal Memory: 512",
        "Total Memory: 4096",
    ]


def test_perf_detail_carries_its_text_length_as_the_real_server_does(
    legacy_daemon: LegacyDaemonFactory, tmp_path: Path
) -> None:
    """PERF_DETAIL (perf_debug): data length strlen + 9, u64 strlen at 0x7c, the text and its NUL."""
    client = connected(legacy_daemon())
    client.sequence = 0
    model = stub_model(tmp_path / "m.rknn")
    size = HEADER + 4 + len(model) + 132
    head = bytearray(header(LOAD, 1, size))
    struct.pack_into("<I", head, 0x10, 0x9)  # rknn_init flags: perf_debug
    client.sock.sendall(
        struct.pack("<I", size) + bytes(head) + struct.pack("<I", len(model)) + model + bytes(132)
    )
    load = client.reply()
    assert load.ack == 0
    client.context, client.sequence = load.context, 1
    run_once(client, np.zeros(SHAPE, np.float32))
    detail = client.ioctl(1)
    text = detail.text(0x84)
    assert "Network Layer Information Table" in text
    assert struct.unpack_from("<IIQQ", detail.data, 0x6C) == (0, 1, len(text) + 9, len(text))
    assert len(detail.data) == 0x7C + len(text) + 9 + 1


def protocol_errors(daemon: LegacyDaemon) -> str:
    return "\n".join(
        line for line in daemon.process.log_text().splitlines() if "legacy_protocol_error" in line
    )


def test_wrong_magic_closes_that_connection_without_a_crash_report_and_others_are_still_served(
    daemon: LegacyDaemon,
) -> None:
    """No crash report for a bad frame: after one the toolkit kills and restarts the board's daemon."""
    client = connected(daemon)
    bad = bytearray(header(VERSION, 1, HEADER))
    bad[0:4] = b"XXXX"
    client.sock.sendall(struct.pack("<I", len(bad)) + bytes(bad))
    with pytest.raises(EOFError):
        client.reply()
    assert connected(daemon).call(VERSION).command == VERSION_ACK
    assert "bad magic 0x58585858" in protocol_errors(daemon)


@pytest.mark.parametrize(
    ("command", "length", "said"),
    [
        (VERSION, 100 << 20, "VERSION message of 104857600 bytes; the limit for it is 65536"),
        (MULTI_INPUT, 1 << 30, "MULTI_INPUT message of 1073741824 bytes"),
        (VERSION, 12, "a frame of 12 bytes; every message has a 108-byte header"),
        (99, HEADER, "command 99 (a message of 108 bytes) is not a request"),
    ],
)
def test_frames_beyond_the_limits_close_the_connection_before_their_body_is_read(
    legacy_daemon: LegacyDaemonFactory, command: int, length: int, said: str
) -> None:
    daemon = legacy_daemon("--max-message-bytes", str(1 << 20))
    client = connected(daemon)
    # Only the length and the header travel: the connection ends without the body ever being sent.
    client.sock.sendall(struct.pack("<I", length) + header(command, 1, length)[: min(length, HEADER)])
    with pytest.raises(EOFError):
        client.reply()
    assert connected(daemon).call(VERSION).command == VERSION_ACK
    assert said in protocol_errors(daemon)


def test_a_model_over_the_limit_gets_the_load_ack_fail_before_its_body_is_read(
    legacy_daemon: LegacyDaemonFactory, tmp_path: Path
) -> None:
    """As the real server refuses a model (ACK_FAIL, the toolkit's RKNN_ERR_MODEL_INVALID). The body
    the toolkit goes on sending is read and dropped, then the connection serves the next request."""
    daemon = legacy_daemon("--max-model-bytes", str(1 << 20))
    client = connected(daemon)
    model = bytes(2 << 20)
    body = struct.pack("<I", len(model)) + model + bytes(132)
    size = HEADER + len(body)
    client.sock.sendall(struct.pack("<I", size) + header(LOAD, 1, size) + body[:4])
    load = client.reply()
    assert (load.command, len(load.data), load.ack, load.context) == (LOAD_ACK, 0x170, ACK_FAIL, -1)
    client.sock.sendall(body[4:])
    client.sequence = 1
    loaded = client.load(stub_model(tmp_path / "m.rknn"))
    # The refused load used up context id 1, as Rockchip's server's refused loads do.
    assert (loaded.ack, loaded.context) == (0, 2)
    np.testing.assert_array_equal(run_once(client, np.zeros(SHAPE, np.float32)), np.ones(SHAPE, np.float32))


def test_a_truncated_frame_and_a_hang_up_mid_load_leave_nothing_behind(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    model = stub_model(tmp_path / "m.rknn")
    client = connected(daemon)
    body = struct.pack("<I", len(model)) + model + bytes(132)
    size = HEADER + len(body)
    client.sock.sendall(struct.pack("<I", size) + header(LOAD, 1, size) + body[: len(body) // 2])
    client.close()
    truncated = connected(daemon)
    truncated.sock.sendall(struct.pack("<I", 1000) + bytes(10))
    truncated.close()
    survivor = connected(daemon)
    assert survivor.load(model).command == LOAD_ACK
    assert open_sessions(daemon) == 1
    survivor.close()
    wait_for_sessions(daemon, 0)


def test_a_client_that_hangs_up_mid_run_has_its_session_freed(daemon: LegacyDaemon, tmp_path: Path) -> None:
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    client.set_inputs([np.ones(SHAPE, np.float32)])
    client.send(5, pad_to=0x478)  # MsgRun, then gone before the answer
    client.sock.shutdown(socket.SHUT_RDWR)
    client.close()
    wait_for_sessions(daemon, 0)
    other = connected(daemon)
    assert other.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    np.testing.assert_array_equal(run_once(other, np.zeros(SHAPE, np.float32)), np.ones(SHAPE, np.float32))


def test_two_clients_at_once_each_run_their_own_model(daemon: LegacyDaemon, tmp_path: Path) -> None:
    first, second = connected(daemon), connected(daemon)
    assert first.load(stub_model(tmp_path / "double.rknn", 2.0, 1.0)).command == LOAD_ACK
    assert second.load(stub_model(tmp_path / "triple.rknn", 3.0, 0.0)).command == LOAD_ACK
    x = np.random.default_rng(1).uniform(-5, 5, SHAPE).astype(np.float32)
    for _ in range(5):
        first.set_inputs([x])
        second.set_inputs([x])
        first.send(5, pad_to=0x478)
        second.send(5, pad_to=0x478)
        (a,) = finish_outputs(first.reply(), [np.dtype(np.float32)])
        (b,) = finish_outputs(second.reply(), [np.dtype(np.float32)])
        np.testing.assert_array_equal(a.reshape(SHAPE), np.float32(2) * x + np.float32(1))
        np.testing.assert_array_equal(b.reshape(SHAPE), np.float32(3) * x)
    assert open_sessions(daemon) == 2
    first.close()
    second.close()
    wait_for_sessions(daemon, 0)


@pytest.mark.parametrize(
    ("arrays", "said"),
    [
        (
            [np.ones((1, 2, 2, 2), np.float32)],
            "input 0 (image) is 32 bytes; shape [1, 2, 2, 3] of float32 takes 48",
        ),
        ([np.ones(SHAPE, np.float32)] * 2, "2 inputs were sent; the model has 1 (image)"),
        # rknn_inputs_set converts float16, int8, uint8 and int16 data, not int32 (the one intake's rule)
        ([np.ones(SHAPE, np.int32)], "input 0 (image) is int32; the model expects float32"),
    ],
)
def test_inputs_that_contradict_the_model_get_the_set_input_ack_and_the_run_fails(
    daemon: LegacyDaemon, tmp_path: Path, arrays: list[np.ndarray], said: str
) -> None:
    """As the real server: MSG_SET_INPUT_ACK (0x70 bytes, ACK_INVALD_INPUT) in answer to the inputs;
    the run that follows gets a MsgFinish with no outputs and the same code, never a crash report."""
    client = connected(daemon)
    load = client.load(stub_model(tmp_path / "m.rknn"))
    client.set_inputs(arrays)
    refused = client.reply()
    assert (refused.command, len(refused.data), refused.ack) == (SET_INPUT_ACK, 0x70, ACK_INVALD_INPUT)
    assert refused.context == load.context
    finish = client.run()
    assert finish.command == FINISH and struct.unpack_from("<II", finish.data, 0x74) == (ACK_INVALD_INPUT, 0)
    np.testing.assert_array_equal(run_once(client, np.zeros(SHAPE, np.float32)), np.ones(SHAPE, np.float32))
    daemon.process.stop()
    assert said in daemon.process.log_text()


def test_a_larger_input_runs_on_the_bytes_the_model_needs(daemon: LegacyDaemon, tmp_path: Path) -> None:
    """librknnrt's rule is size >= needed: the real server runs a longer input on its first bytes."""
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).ack == 0
    longer = np.arange(16, dtype=np.float32)
    client.set_inputs([longer])
    (output,) = finish_outputs(client.run(), [np.dtype(np.float32)])
    np.testing.assert_array_equal(output, 2 * longer[:12] + 1)
    daemon.process.stop()
    assert '"legacy_input_longer"' in daemon.process.log_text()


def test_inputs_over_this_daemons_limit_fail_only_the_run(
    legacy_daemon: LegacyDaemonFactory, tmp_path: Path
) -> None:
    """Inputs the toolkit sends in good faith but this daemon refuses (its limits) get no
    MSG_SET_INPUT_ACK (after one the toolkit kills the board's daemon): the run fails with ACK_INVALD_INPUT."""
    client = connected(legacy_daemon("--max-tensor-bytes", "40"))
    assert client.load(stub_model(tmp_path / "m.rknn")).ack == 0
    client.set_inputs([np.ones(SHAPE, np.float32)])
    finish = client.run()
    assert finish.command == FINISH and struct.unpack_from("<II", finish.data, 0x74) == (ACK_INVALD_INPUT, 0)


def test_a_request_for_another_context_closes_that_connection(daemon: LegacyDaemon, tmp_path: Path) -> None:
    """The real server never answers it (its client would wait forever); this daemon hangs up."""
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).ack == 0
    client.context += 1000
    client.send(RUN, pad_to=0x478)
    with pytest.raises(EOFError):
        client.reply()
    assert connected(daemon).call(VERSION).command == VERSION_ACK
    assert f"a request for context {client.context}" in protocol_errors(daemon)


def test_load_acks_count_context_ids_per_daemon_lifetime(daemon: LegacyDaemon, tmp_path: Path) -> None:
    model = stub_model(tmp_path / "m.rknn")
    first, second = connected(daemon), connected(daemon)
    ids = [first.load(model).context, second.load(model).context, first.load(model).context]
    assert ids[1:] == [ids[0] + 1, ids[0] + 2]
    assert first.load(b"not a model").context == -1  # a refused load keeps -1


def test_requests_out_of_order_or_unknown_are_answered_with_the_reason(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    """Each gets the ack it waits for with an error code (the reason is in the daemon's log)."""
    client = connected(daemon)
    no_model = client.run()
    assert no_model.command == FINISH and struct.unpack_from("<I", no_model.data, 0x74)[0] != 0
    info = client.ioctl(0)
    assert (info.command, info.ack, len(info.data)) == (IOCTL_ACK, ACK_FAIL, 0x7C + MODEL_INFO_BYTES + 1)
    garbage = client.load(b"not a model")
    assert (garbage.command, len(garbage.data), garbage.ack) == (LOAD_ACK, 0x170, ACK_FAIL)
    assert client.load(stub_model(tmp_path / "m.rknn")).ack == 0
    assert client.run().command == FINISH  # no inputs yet
    # After loading, the client waits on an ioctl ack only: an unknown query gets ACK_IOCTL_UNKNOWN_CMD.
    unknown = client.ioctl(99)
    assert unknown.command == IOCTL_ACK and struct.unpack_from("<II", unknown.data, 0x6C) == (7, 99)
    shape = client.call(SET_INPUT_SHAPE, pad_to=0xB4F0)  # not decoded: refused with its ack
    assert (shape.command, shape.ack) == (SET_INPUT_SHAPE_ACK, ACK_FAIL)
    # A model size larger than the frame: ACK_FAIL, and the frame's bytes are read past.
    partial = client.call(LOAD, struct.pack("<I", 1 << 20) + b"RKNN")
    assert (partial.command, partial.ack) == (LOAD_ACK, ACK_FAIL)
    assert client.call(VERSION).command == VERSION_ACK
    daemon.process.stop()
    log = daemon.process.log_text()
    assert "no model is loaded on this connection" in log and "inference without inputs" in log
    assert "the model is 1048576 bytes but this message carries 4" in log


def test_the_uninitialised_header_bytes_are_never_logged(daemon: LegacyDaemon) -> None:
    client = connected(daemon)
    client.send(VERSION, junk=b"AWS_SECRET=hunter2;")
    reply = client.reply()
    assert reply.command == VERSION_ACK
    assert reply.data[0x30:HEADER] == bytes(HEADER - 0x30)  # and never echoed
    client.send(42, junk=b"AWS_SECRET=hunter2;")
    with pytest.raises(EOFError):
        client.reply()
    daemon.process.stop()
    assert "command 42" in daemon.process.log_text()
    assert "hunter2" not in daemon.process.log_text()


def test_a_client_of_another_release_gets_a_crash_report_naming_the_supported_ones(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    """A release whose structs differ sends other request sizes: answering it in this layout would
    be misread (its client checks every ack's size), so it gets the versions and the way out."""
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    for reply in (client.call(8, struct.pack("<I", 0), pad_to=0x7D), client.call(5, pad_to=0x480)):
        assert len(reply.data) == CRASH_BYTES, reply.command
        text = reply.text()
        assert "RKNN-Toolkit2 2.3.2, 2.5.0 only" in text, text
        assert "pip install rknn-toolkit2==2.5.0" in text and "upgrade rknn-server-oss" in text
    assert (
        "IOCTL request of 125 bytes; RKNN-Toolkit2 2.5.0 sends 121"
        in client.call(8, struct.pack("<I", 0), pad_to=0x7D).text()
    )
    # The same connection, at the known sizes, is served as before.
    assert client.ioctl(0).command == IOCTL_ACK
    np.testing.assert_array_equal(run_once(client, np.zeros(SHAPE, np.float32)), np.ones(SHAPE, np.float32))


def test_the_daemon_speaks_the_release_it_is_told(legacy_daemon: LegacyDaemonFactory) -> None:
    daemon = legacy_daemon("--legacy-toolkit-version", "2.3.2")
    version = connected(daemon).call(VERSION)
    assert (version.command, len(version.data)) == (VERSION_ACK, 0x170)
    assert version.text().startswith("rknn_server: 2.3.2 (rknn-server-oss")


def test_each_answered_request_is_recorded_like_a_grpc_call(daemon: LegacyDaemon, tmp_path: Path) -> None:
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    run_once(client, np.zeros(SHAPE, np.float32))
    assert client.run().command == FINISH  # no inputs: refused
    daemon.process.stop()
    events = [json.loads(line) for line in daemon.process.log_text().splitlines() if line.startswith("{")]
    runs = [e for e in events if e.get("event") == "rpc" and e["method"] == "legacy.RUN"]
    assert [e["outcome"] for e in runs] == ["OK", "INVALID_ARGUMENT"]
    assert runs[0]["bytes_in"] > 12 * 4 and runs[0]["bytes_out"] > 12 * 4 and runs[0]["session"]
    assert [e["outcome"] for e in events if e.get("method") == "legacy.LOAD"] == ["OK"]


def test_a_run_is_timed_into_the_per_model_metrics_as_every_door_s(
    legacy_daemon: LegacyDaemonFactory, tmp_path: Path
) -> None:
    """The toolkit's runs take the data plane's one run path: queue and compute are observed per model."""
    daemon = legacy_daemon("--metrics-listen", "tcp://127.0.0.1:0")
    base = metrics_base(daemon.process)
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    for _ in range(3):
        run_once(client, np.zeros(SHAPE, np.float32))
    found = scrape(f"{base}/metrics")
    for family in ("rknn_model_queue_seconds", "rknn_model_compute_seconds"):
        counts = samples(found[family], f"{family}_count")
        assert sum(counts.values()) == 3, (family, counts)
