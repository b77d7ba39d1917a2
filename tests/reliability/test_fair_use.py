"""Fair use against a real daemon: one client's idle streams cannot lock other clients out.

The attack of issue #12 item 4: one client opens 80 calls that never finish (uploads and inferences
that send a header and then nothing, reservations waiting behind its own). Its calls beyond its share
are refused naming the limit, its idle streams are ended after the idle timeout, and a second client
keeps getting answers at its normal speed all along.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from rknn_proto import codec, rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import FileEntry, manifest_digest
from tests.reliability.conftest import OTHER_TOKEN, TOKEN, StartDaemon, cnn_input, device

IDLE_TIMEOUT_S = 3.0
PER_CLIENT = 16
HEX = "0" * 64


def _held(first: list[object], release: threading.Event) -> Iterator[object]:
    """A request stream that sends its first messages and then nothing until `release`."""
    yield from first
    release.wait(120)


def _upload_header(i: int) -> rknn_pb2.UploadModelRequest:
    """The header of an upload of a model of its own (two uploads of one model conflict)."""
    name = f"m{i}.onnx"
    manifest = rknn_pb2.ModelManifest(
        digest=manifest_digest([FileEntry(name, 1 << 20, HEX)]),
        files=[rknn_pb2.ModelFile(name=name, size=1 << 20, sha256=HEX)],
    )
    return rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=manifest, start_offsets=[0]))


def _attack(
    stub: rknn_pb2_grpc.RknnServerStub, session_id: str, release: threading.Event
) -> tuple[list[grpc.Future], list[Any]]:
    """80 calls from one client: 4 reservations waiting behind its own, then 76 idle streams."""
    md = (("authorization", f"Bearer {TOKEN}"),)
    waits = [
        stub.Reserve.future(rknn_pb2.ReserveRequest(holder=f"wait-{i}", wait_s=600), metadata=md, timeout=120)
        for i in range(4)
    ]
    x = codec.wire_array(cnn_input())
    header = rknn_pb2.InferenceRequest(
        header=rknn_pb2.InferenceHeader(session_id=session_id, inputs=[codec.meta_of(x)])
    )
    half = rknn_pb2.InferenceRequest(
        chunk=rknn_pb2.TensorChunk(tensor_index=0, data=x.tobytes()[: x.nbytes // 2])
    )
    streams: list[Any] = []  # grpc.Future and grpc.Call at once
    for i in range(76):
        if i % 2:
            call = stub.UploadModel.future(_held([_upload_header(i)], release), metadata=md, timeout=120)
        else:
            call = stub.Inference(_held([header, half], release), metadata=md, timeout=120)
        streams.append(call)
    return waits, streams


def test_idle_streams_of_one_client_do_not_lock_out_another(
    daemons: StartDaemon, token_file: Path, cnn: Path
) -> None:
    daemon = daemons(
        "--auth-token-file", str(token_file),
        "--stream-idle-timeout", str(IDLE_TIMEOUT_S), "--max-inflight-per-client", str(PER_CLIENT),
    )  # fmt: skip
    release = threading.Event()
    with (
        device(daemon, token=TOKEN) as alice,
        device(daemon, token=OTHER_TOKEN) as bob,
        bob.load(cnn) as bob_session,
        alice.load(cnn) as alice_session,
        grpc.insecure_channel(daemon.address) as channel,
    ):
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        x = cnn_input()
        expected = bob_session.run([x])[0]
        normal = []
        for _ in range(20):
            start = time.perf_counter()
            bob_session.run([x])
            normal.append(time.perf_counter() - start)
        held = stub.Reserve(
            rknn_pb2.ReserveRequest(holder="alice", ttl_s=300),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=30,
        )
        waits, streams = _attack(stub, alice_session.id, release)
        attacked = []
        try:
            deadline = time.monotonic() + 60
            while not all(s.done() for s in streams) and time.monotonic() < deadline:
                start = time.perf_counter()
                np.testing.assert_allclose(bob_session.run([x])[0], expected)
                attacked.append(time.perf_counter() - start)
            codes = [s.code() for s in streams]
            refused = [s.details() for s in streams if s.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
            idled = [s.details() for s in streams if s.code() == grpc.StatusCode.DEADLINE_EXCEEDED]
            assert not [w for w in waits if w.done()], "a reservation waiter ended early"
        finally:
            release.set()
            for wait in waits:
                wait.cancel()
        print(
            f"\nbob's Run latency: normal p50 {statistics.median(normal) * 1e3:.1f} ms max "
            f"{max(normal) * 1e3:.1f} ms; under 80 idle calls p50 {statistics.median(attacked) * 1e3:.1f} ms "
            f"max {max(attacked) * 1e3:.1f} ms over {len(attacked)} runs; alice's streams: {len(refused)} "
            f"refused, {len(idled)} ended idle"
        )
        assert len(refused) + len(idled) == len(streams), codes
        # 4 waiting reservations hold 4 of alice's slots: the other 12 went to streams that idled out.
        assert len(idled) == PER_CLIENT - len(waits)
        assert all(f"max_inflight_per_client={PER_CLIENT}" in d for d in refused)
        assert all("stream_idle_timeout" in d and "--stream-idle-timeout" in d for d in idled)
        assert len(attacked) >= 5 and max(attacked) < 2.0
        # Alice is served again once her calls ended, and her reservation was never disturbed.
        assert alice_session.run([x])[0].shape == (1, 10)
        stub.ReleaseReservation(
            rknn_pb2.ReleaseReservationRequest(token=held.token),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=30,
        )


def test_waiting_reservations_do_not_take_the_shared_slots(
    daemons: StartDaemon, token_file: Path, cnn: Path
) -> None:
    """Reserve calls waiting for the board hold nothing but a timer: they count against their own
    client's share only, so they cannot fill --max-inflight-requests for everyone else."""
    daemon = daemons(
        "--auth-token-file", str(token_file),
        "--max-inflight-requests", "3", "--max-inflight-per-client", "3",
    )  # fmt: skip
    md = (("authorization", f"Bearer {TOKEN}"),)
    with (
        device(daemon, token=OTHER_TOKEN) as bob,
        bob.load(cnn) as session,
        grpc.insecure_channel(daemon.address) as channel,
    ):
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        held = stub.Reserve(rknn_pb2.ReserveRequest(holder="alice", ttl_s=300), metadata=md, timeout=30)
        waits = [
            stub.Reserve.future(rknn_pb2.ReserveRequest(holder=f"w{i}", wait_s=600), metadata=md, timeout=120)
            for i in range(4)
        ]
        try:
            refused = waits[3].exception(timeout=30)  # alice's fourth call is over her share of 3
            assert isinstance(refused, grpc.RpcError)
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert "max_inflight_per_client=3" in refused.details()  # type: ignore[attr-defined]
            assert not any(w.done() for w in waits[:3])
            for _ in range(5):  # three calls wait, yet bob's calls find the shared slots free
                assert session.run([cnn_input()])[0].shape == (1, 10)
        finally:
            for wait in waits:
                wait.cancel()
        stub.ReleaseReservation(rknn_pb2.ReleaseReservationRequest(token=held.token), metadata=md, timeout=30)
