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
    CRASH_BYTES,
    FINISH,
    HEADER,
    IOCTL_ACK,
    LOAD,
    LOAD_ACK,
    MULTI_INPUT,
    UNLOAD,
    UNLOAD_ACK,
    VERSION,
    VERSION_ACK,
    WireClient,
    finish_outputs,
    header,
)
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


def run_once(client: WireClient, x: np.ndarray) -> np.ndarray:
    client.set_inputs([x])
    reply = client.run()
    assert reply.command == FINISH, reply.text()
    (output,) = finish_outputs(reply, [np.dtype(np.float32)])
    return output.reshape(SHAPE)


@pytest.fixture
def daemon(legacy_daemon: LegacyDaemonFactory) -> LegacyDaemon:
    return legacy_daemon("--max-message-bytes", str(1 << 20), "--log-level", "debug")


def test_a_whole_session_over_the_wire(daemon: LegacyDaemon, tmp_path: Path) -> None:
    client = connected(daemon)
    version = client.call(VERSION)
    assert (version.command, len(version.data)) == (VERSION_ACK, 0x170)
    assert version.text().startswith("rknn_server: 2.5.0 (rknn-server-oss")
    assert "\nrknnrt: 2.3.2" in version.text()
    load = client.load(stub_model(tmp_path / "m.rknn"))
    assert (load.command, len(load.data), struct.unpack_from("<I", load.data, 0x6C)[0]) == (
        LOAD_ACK,
        0x170,
        0,
    )
    info = client.ioctl(0)
    assert info.command == IOCTL_ACK
    assert struct.unpack_from("<IIQ", info.data, 0x6C) == (0, 0, MODEL_INFO_BYTES)
    assert len(info.data) == 0x7C + MODEL_INFO_BYTES
    assert struct.unpack_from("<I", info.data, 0x7C)[0] == 1
    assert info.data[0x80:0x86] == b"image\0"
    assert info.data[0x80 + 0x100] == 4
    assert struct.unpack_from("<4I", info.data, 0x80 + 0x101) == SHAPE
    assert tuple(info.data[0x80 + 0x141 : 0x80 + 0x143]) == (1, 0)  # NHWC, FP32
    assert struct.unpack_from("<I", info.data, 0xAD91)[0] == 1
    assert info.data[0xAD95:0xAD9B] == b"score\0"
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    np.testing.assert_array_equal(run_once(client, x), 2 * x + 1)
    assert open_sessions(daemon) == 1
    assert client.call(UNLOAD).command == UNLOAD_ACK
    assert open_sessions(daemon) == 0
    # The toolkit's reader thread returns only when the daemon hangs up after the unload.
    with pytest.raises(EOFError):
        client.reply()
    client.close()


def test_queries_after_a_run_answer_in_the_reader_thread_layout(daemon: LegacyDaemon, tmp_path: Path) -> None:
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    run_once(client, np.zeros(SHAPE, np.float32))
    perf_run = client.ioctl(2)  # PERF_RUN: the last run's duration in microseconds at 0x7c
    assert struct.unpack_from("<II", perf_run.data, 0x6C) == (0, 2)
    assert 0 < struct.unpack_from("<Q", perf_run.data, 0x7C)[0] < 10_000_000
    memory = client.ioctl(3)  # MEMORY_DETAIL: "Name: bytes" lines from 0x84, length at 0x7c
    (length,) = struct.unpack_from("<Q", memory.data, 0x7C)
    text = memory.data[0x84 : 0x84 + length].rstrip(b"\0").decode()
    assert text.splitlines() == [
        "Total Weight Memory: 1024",
        "Total Internal Memory: 512",
        "Total Memory: 4096",
    ]


def test_wrong_magic_gets_a_crash_report_and_others_are_still_served(daemon: LegacyDaemon) -> None:
    client = connected(daemon)
    bad = bytearray(header(VERSION, 1, HEADER))
    bad[0:4] = b"XXXX"
    client.sock.sendall(struct.pack("<I", len(bad)) + bytes(bad))
    crash = client.reply()
    assert len(crash.data) == CRASH_BYTES
    assert "bad magic 0x58585858" in crash.text() and "expected 0x05019d62" in crash.text()
    with pytest.raises(EOFError):
        client.reply()
    assert connected(daemon).call(VERSION).command == VERSION_ACK


@pytest.mark.parametrize(
    ("command", "length", "said"),
    [
        (VERSION, 100 << 20, "VERSION message of 104857600 bytes; the limit for it is 65536"),
        (MULTI_INPUT, 1 << 30, "MULTI_INPUT message of 1073741824 bytes"),
        (LOAD, 0xFFFFFFFF, "LOAD message of 4294967295 bytes"),
        (VERSION, 12, "a frame of 12 bytes; every message has a 108-byte header"),
    ],
)
def test_frames_beyond_the_limits_are_refused_before_their_body_is_read(
    legacy_daemon: LegacyDaemonFactory, command: int, length: int, said: str
) -> None:
    daemon = legacy_daemon("--max-message-bytes", str(1 << 20), "--max-model-bytes", str(64 << 20))
    client = connected(daemon)
    # Only the length and the header travel: the answer comes without the body ever being sent.
    client.sock.sendall(struct.pack("<I", length) + header(command, 1, length)[: min(length, HEADER)])
    crash = client.reply()
    assert len(crash.data) == CRASH_BYTES and said in crash.text(), crash.text()
    assert connected(daemon).call(VERSION).command == VERSION_ACK


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
    ],
)
def test_inputs_that_do_not_fit_the_model_get_a_crash_report_naming_why(
    daemon: LegacyDaemon, tmp_path: Path, arrays: list[np.ndarray], said: str
) -> None:
    client = connected(daemon)
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    client.set_inputs(arrays)
    crash = client.run()
    assert len(crash.data) == CRASH_BYTES and said in crash.text(), crash.text()
    np.testing.assert_array_equal(run_once(client, np.zeros(SHAPE, np.float32)), np.ones(SHAPE, np.float32))


def test_requests_out_of_order_or_unknown_are_answered_with_the_reason(
    daemon: LegacyDaemon, tmp_path: Path
) -> None:
    client = connected(daemon)
    assert "no model is loaded on this connection" in client.run().text()
    assert client.load(b"not a model").command != LOAD_ACK
    assert client.load(stub_model(tmp_path / "m.rknn")).command == LOAD_ACK
    assert "inference without inputs" in client.run().text()
    # After loading, the client waits on an ioctl ack only: an unknown query gets ACK_IOCTL_UNKNOWN_CMD.
    unknown = client.ioctl(99)
    assert unknown.command == IOCTL_ACK and struct.unpack_from("<II", unknown.data, 0x6C) == (7, 99)
    crash = client.call(LOAD, struct.pack("<I", 1 << 20) + b"RKNN")
    assert "the model is 1048576 bytes but this message carries 4" in crash.text()


def test_the_uninitialised_header_bytes_are_never_logged(daemon: LegacyDaemon) -> None:
    client = connected(daemon)
    client.send(VERSION, junk=b"AWS_SECRET=hunter2;")
    assert client.reply().command == VERSION_ACK
    client.send(42, junk=b"AWS_SECRET=hunter2;")
    assert "unknown command 42" in client.reply().text()
    daemon.process.stop()
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
    assert "inference without inputs" in client.run().text()
    daemon.process.stop()
    events = [json.loads(line) for line in daemon.process.log_text().splitlines() if line.startswith("{")]
    runs = [e for e in events if e.get("event") == "rpc" and e["method"] == "legacy.RUN"]
    assert [e["outcome"] for e in runs] == ["OK", "INVALID_ARGUMENT"]
    assert runs[0]["bytes_in"] > 12 * 4 and runs[0]["bytes_out"] > 12 * 4 and runs[0]["session"]
    assert [e["outcome"] for e in events if e.get("method") == "legacy.LOAD"] == ["OK"]
