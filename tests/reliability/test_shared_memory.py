"""Shared-memory tensors against a live daemon: same results as the wire, and every attack refused.

The regions are real files in /dev/shm (or in a folder bind-mounted over it in a mount namespace of
its own); what the daemon holds is read from /proc/<daemon pid>/fd and /proc/<daemon pid>/maps."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import helper

from rknn_client import RKNN
from rknn_client.device import Device
from rknn_client.errors import InvalidInput
from rknn_client.local import shared_memory
from rknn_client.transport.tcp import tcp_endpoint
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.ready import read_ready_file
from rknn_server.testing import DaemonProcess
from tests.models import big_identity, identity_of, save_graph
from tests.reliability.conftest import (
    TOKEN,
    StartDaemon,
    cnn_input,
    device,
    events,
    kill,
    python_child,
    rpcs,
    wait_line,
)

SHM = Path("/dev/shm")
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="a second local user and mount namespaces need root")


def held(pid: int, name: str) -> list[str]:
    """What the daemon holds of a region file: open descriptors and mappings naming it."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if name in target:
            found.append(target)
    return found + [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if name in line]


def wait_until(condition: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def uses(dev: Device, session_id: str) -> int:
    status = dev._stub.SharedMemoryStatus(rknn_pb2.SharedMemoryStatusRequest(), metadata=dev.metadata)
    return sum(r.uses for r in status.regions if r.session_id == session_id)


@pytest.fixture
def region_file() -> Iterator[Path]:
    """A 64 KiB file in /dev/shm made by the test (root), removed at the end."""
    path = SHM / f"rknn-test-{secrets.token_hex(6)}"
    path.write_bytes(b"\xab" * 65536)
    path.chmod(0o600)
    yield path
    path.unlink(missing_ok=True)


def register(dev: Device, key: str, name: str, session_id: str = "") -> rknn_pb2.RegisterSharedMemoryResponse:
    request = rknn_pb2.RegisterSharedMemoryRequest(key=key, name=name, session_id=session_id)
    reply: rknn_pb2.RegisterSharedMemoryResponse = dev._stub.RegisterSharedMemory(
        request, metadata=dev.metadata, timeout=30
    )
    return reply


def run_shared(
    dev: Device, session_id: str, key: str, out_bytes: int = 40, in_offset: int = 0, truncate_to: int = -1
) -> rknn_pb2.RunResponse:
    meta = rknn_pb2.TensorMeta(
        dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, 3, 16, 16], layout=rknn_pb2.LAYOUT_NCHW, byte_length=3072
    )
    header = rknn_pb2.InferenceHeader(
        session_id=session_id,
        inputs=[meta],
        input_regions=[rknn_pb2.TensorRegion(key=key, offset=in_offset, byte_length=3072)],
        output_regions=[rknn_pb2.TensorRegion(key=key, offset=32768, byte_length=out_bytes)],
    )
    reply: rknn_pb2.RunResponse = dev._stub.RunShared(
        rknn_pb2.RunRequest(header=header), metadata=dev.metadata, timeout=30
    )
    return reply


@pytest.mark.parametrize("kind", ["memfd", "file"])
def test_outputs_through_shared_memory_equal_the_wire_bit_for_bit(
    daemons: StartDaemon, cnn: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RKNN_SHM", "on" if kind == "memfd" else "file")
    daemon = daemons()
    frames = [
        np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32) for seed in range(5)
    ]
    with device(daemon) as shared, shared.load(cnn) as session, device(daemon) as wire:
        shared_memory.disable(wire)
        with wire.load(cnn) as wired:
            for frame in frames:
                got, want = session.run([frame]), wired.run([frame])
                assert [a.tobytes() for a in got] == [a.tobytes() for a in want]
                assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
            assert uses(shared, session.id) == len(frames)  # every frame went through the region
            assert uses(wire, wired.id) == 0
            name = next(r.name for r in _status(shared).regions if r.session_id == session.id)
            maps = Path(f"/proc/{daemon.pid}/maps").read_text()
            assert (name in maps) is (kind == "memfd")  # only a sealed memfd is ever mapped
            assert held(daemon.pid, name)
            assert session.run([cnn_input()])[0].shape == (1, 10)


def test_the_compat_rknn_inference_uses_shared_memory_by_itself(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    rknn = RKNN()
    try:
        assert rknn.load_onnx(str(cnn)) == 0
        assert rknn.build(do_quantization=False) == 0
        assert rknn.init_runtime(device_id=daemon.url) == 0
        image = np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8)
        first = rknn.inference(inputs=[image])
        second = rknn.inference(inputs=[image])
        assert first is not None and second is not None
        assert first[0].tobytes() == second[0].tobytes()
        session = rknn._runtime.session
        assert session is not None
        with device(daemon) as observer:  # the same user: the same client identity
            assert uses(observer, session.id) == 2
    finally:
        rknn.release()
    # Both frames rung on one doorbell: no call of their own.
    assert rpcs(daemon, "OpenDoorbell") == 1 and rpcs(daemon, "RunShared") == 0 and rpcs(daemon, "Run") == 0
    assert wait_until(lambda: events(daemon, "doorbell_closed"))
    assert events(daemon, "doorbell_closed")[0]["frames"] == 2


def test_a_slot_too_small_or_outside_the_region_is_refused_before_any_write(
    daemons: StartDaemon, cnn: Path, region_file: Path
) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        register(dev, "k", region_file.name, session.id)
        with pytest.raises(grpc.RpcError) as small:
            run_shared(dev, session.id, "k", out_bytes=39)  # the output is 10 float32: 40 bytes
        assert small.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holds 39" in (small.value.details() or "")
        with pytest.raises(grpc.RpcError) as outside:
            run_shared(dev, session.id, "k", in_offset=65536 - 100)
        assert outside.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert region_file.read_bytes() == b"\xab" * 65536  # nothing was written
        reply = run_shared(dev, session.id, "k")
        assert reply.header.outputs[0].byte_length == 40 and not reply.outputs
        assert region_file.read_bytes()[32768 : 32768 + 40] != b"\xab" * 40


def test_a_region_truncated_after_registering_fails_the_call_not_the_daemon(
    daemons: StartDaemon, cnn: Path, region_file: Path
) -> None:
    daemon = daemons()
    with device(daemon) as dev, dev.load(cnn) as session:
        register(dev, "k", region_file.name, session.id)
        run_shared(dev, session.id, "k")
        os.truncate(region_file, 1000)  # the client shrinks the file under the daemon
        with pytest.raises(grpc.RpcError) as truncated:
            run_shared(dev, session.id, "k")
        assert truncated.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "truncated" in (truncated.value.details() or "")
        assert daemon.process.poll() is None  # no SIGBUS: the daemon holds no mapping of the file
        assert session.run([cnn_input()])[0].shape == (1, 10)
        with device(daemon) as other, other.load(cnn) as fresh:
            assert fresh.run([cnn_input()])[0].shape == (1, 10)
            assert uses(other, fresh.id) == 1


@pytest.mark.parametrize("name", ["../../etc/passwd", "sub/file", "..", "link"])
def test_names_outside_dev_shm_and_links_are_refused(
    daemons: StartDaemon, name: str, region_file: Path
) -> None:
    daemon = daemons()
    link = SHM / f"rknn-test-link-{secrets.token_hex(4)}"
    link.symlink_to(region_file)
    try:
        with device(daemon) as dev:
            with pytest.raises(grpc.RpcError) as refused:
                register(dev, "k", link.name if name == "link" else name)
            assert refused.value.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.PERMISSION_DENIED,
            )
            assert held(daemon.pid, region_file.name) == []
    finally:
        link.unlink()


_INTRUDER = """
import json, os, sys, grpc
from rknn_proto import rknn_pb2, rknn_pb2_grpc
address, name, key, sid = sys.argv[1:5]
os.setuid(65534)  # everything is imported: from here on, another user of this machine
stub = rknn_pb2_grpc.RknnServerStub(grpc.insecure_channel(address))
def attempt(call):
    try:
        call()
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name
region = rknn_pb2.TensorRegion(key=key, offset=0, byte_length=3072)
header = rknn_pb2.InferenceHeader(session_id=sid, input_regions=[region], output_regions=[region])
print(json.dumps({
    "allowed": stub.GetInfo(rknn_pb2.GetInfoRequest(), timeout=30).shared_memory.allowed,
    "register root's file": attempt(lambda: stub.RegisterSharedMemory(
        rknn_pb2.RegisterSharedMemoryRequest(key="mine", name=name), timeout=30)),
    "status of root's key": attempt(lambda: stub.SharedMemoryStatus(
        rknn_pb2.SharedMemoryStatusRequest(key=key), timeout=30)),
    "unregister root's key": attempt(lambda: stub.UnregisterSharedMemory(
        rknn_pb2.UnregisterSharedMemoryRequest(key=key), timeout=30)),
    "run on root's region": attempt(lambda: stub.RunShared(rknn_pb2.RunRequest(header=header), timeout=30)),
}))
"""


@ROOT
def test_another_user_can_neither_register_my_file_nor_touch_my_region(
    daemons: StartDaemon, cnn: Path, region_file: Path
) -> None:
    daemon = daemons()
    region_file.chmod(0o666)  # even a file the intruder could open itself is not its to register
    with device(daemon) as dev, dev.load(cnn) as session:
        register(dev, "k", region_file.name, session.id)
        intruder = subprocess.run(
            [sys.executable, "-c", _INTRUDER, daemon.address, region_file.name, "k", session.id],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert intruder.returncode == 0, intruder.stderr
        answers = json.loads(intruder.stdout)
        assert answers == {
            "allowed": True,  # a local user may use shared memory: its own files
            "register root's file": "PERMISSION_DENIED",
            "status of root's key": "NOT_FOUND",
            "unregister root's key": "NOT_FOUND",
            "run on root's region": "NOT_FOUND",
        }
        assert run_shared(dev, session.id, "k").header.outputs[0].byte_length == 40  # still mine


def _own_address() -> str | None:
    """A non-loopback address of this machine (traffic to it stays on the machine), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_caller_from_a_non_loopback_address_is_refused(
    daemons: StartDaemon, region_file: Path, token_file: Path
) -> None:
    address = _own_address()
    if address is None:
        pytest.skip(
            "this machine has no non-loopback address (the policy is tested in tests/unit/server/core/test_shm.py)"
        )
    daemon = daemons("--listen", f"tcp://{address}:0", "--auth-token-file", str(token_file), listen_tcp=False)
    with grpc.insecure_channel(daemon.address) as channel:
        stub = rknn_pb2_grpc.RknnServerStub(channel)
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        reply = stub.GetInfo(rknn_pb2.GetInfoRequest(), metadata=metadata, timeout=30)
        assert not reply.shared_memory.allowed and "own host" in reply.shared_memory.reason
        with pytest.raises(grpc.RpcError) as refused:
            stub.RegisterSharedMemory(
                rknn_pb2.RegisterSharedMemoryRequest(key="k", name=region_file.name),
                metadata=metadata,
                timeout=30,
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert held(daemon.pid, region_file.name) == []
    with Device(tcp_endpoint(daemon.url), token=TOKEN) as dev:
        assert not shared_memory.usable(dev)  # the client keeps to the wire


def test_closed_on_release_and_after_the_client_is_killed(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons("--session-idle-timeout", "2")
    with device(daemon) as dev:
        session = dev.load(cnn)
        session.run([cnn_input()])
        name = next(r.name for r in _status(dev).regions if r.session_id == session.id)
        assert held(daemon.pid, name)
        session.release()
        assert held(daemon.pid, name) == []  # closed with the session, at once
    child = python_child(_CLIENT, [daemon.url, str(cnn)])
    try:
        name = wait_line(child, "region ").split()[1]
        assert held(daemon.pid, name)
    finally:
        kill(child)
    assert wait_until(lambda: held(daemon.pid, name) == [], timeout=60)  # the idle reaper took it
    assert not (SHM / name).exists()  # the client unlinked it at registration: nothing is left


_CLIENT = """
import sys, numpy as np, rknn_client
from rknn_proto import rknn_pb2
dev = rknn_client.connect(sys.argv[1])
session = dev.load(sys.argv[2])
session.run([np.zeros((1, 3, 16, 16), np.float32)])
status = dev._stub.SharedMemoryStatus(rknn_pb2.SharedMemoryStatusRequest(), metadata=dev.metadata)
print("region", status.regions[0].name, flush=True)
sys.stdin.read()
"""


def _status(dev: Device) -> rknn_pb2.SharedMemoryStatusResponse:
    reply: rknn_pb2.SharedMemoryStatusResponse = dev._stub.SharedMemoryStatus(
        rknn_pb2.SharedMemoryStatusRequest(), metadata=dev.metadata, timeout=30
    )
    return reply


_NS_CLIENT = """
import json, sys, numpy as np, rknn_client
from rknn_proto import rknn_pb2
with rknn_client.connect(sys.argv[1]) as dev, dev.load(sys.argv[2]) as session:
    frame = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    out = session.run([frame])[0]
    status = dev._stub.SharedMemoryStatus(rknn_pb2.SharedMemoryStatusRequest(), metadata=dev.metadata)
    print(json.dumps({"uses": sum(r.uses for r in status.regions), "out": out.tobytes().hex()}))
"""


def _in_namespace(folder: Path, *command: str) -> list[str]:
    """`command` in a mount namespace of its own whose /dev/shm is `folder`."""
    return ["unshare", "-m", "sh", "-c", f'mount --bind "{folder}" /dev/shm && exec "$@"', "sh", *command]


@ROOT
def test_two_mount_namespaces_sharing_a_shm_folder_use_it(tmp_path: Path, cnn: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(_in_namespace(tmp_path, "true")).returncode != 0:
        pytest.skip("unshare -m with a bind mount is not permitted here")
    shared, elsewhere = tmp_path / "shared-shm", tmp_path / "other-shm"
    shared.mkdir(mode=0o1777)
    elsewhere.mkdir(mode=0o1777)
    ready = tmp_path / "ready.json"
    command = [
        sys.executable,
        "-m",
        "rknn_server",
        "--runtime",
        "host",
        "--model-cache",
        str(tmp_path / "cache"),
    ]
    command += ["--listen", "tcp://127.0.0.1:0", "--ready-file", str(ready), "--log-format", "json"]
    with (tmp_path / "daemon.log").open("w") as log:
        process = subprocess.Popen(_in_namespace(shared, *command), stdout=subprocess.DEVNULL, stderr=log)
    daemon = None
    try:
        assert wait_until(lambda: ready.exists() or process.poll() is not None, timeout=60)
        address = read_ready_file(ready).tcp_addresses()[0]
        daemon = DaemonProcess(process, address, tmp_path / "daemon.log")
        answers = {}
        for label, folder in (("shared", shared), ("other", elsewhere)):
            client = subprocess.run(
                _in_namespace(folder, sys.executable, "-c", _NS_CLIENT, daemon.url, str(cnn)),
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "RKNN_SHM": "file"},  # not the memfd (one PID namespace here)
            )
            assert client.returncode == 0, client.stderr
            answers[label] = json.loads(client.stdout)
        assert answers["shared"]["uses"] == 1  # the frame went through the shared folder
        assert answers["other"]["uses"] == 0  # another /dev/shm: the daemon cannot see it, the wire is used
        assert answers["shared"]["out"] == answers["other"]["out"]
        assert list(shared.iterdir()) == list(elsewhere.iterdir()) == []  # unlinked by the clients
    finally:
        if daemon is not None:
            daemon.stop()
        elif process.poll() is None:
            process.kill()
            process.wait()


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("rknn-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def register_memfd(dev: Device, key: str, pid: int, fd: int) -> rknn_pb2.RegisterSharedMemoryResponse:
    request = rknn_pb2.RegisterSharedMemoryRequest(key=key, memfd=True, pid=pid, fd=fd)
    reply: rknn_pb2.RegisterSharedMemoryResponse = dev._stub.RegisterSharedMemory(
        request, metadata=dev.metadata, timeout=30
    )
    return reply


def test_a_memfd_must_be_sealed_against_shrinking_and_be_a_file(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    unsealed = _memfd(65536, 0)
    sealed = _memfd(65536, fcntl.F_SEAL_SHRINK)
    reader, writer = os.pipe()
    try:
        with device(daemon) as dev, dev.load(cnn) as session:
            for fd, code in (
                (unsealed, "INVALID_ARGUMENT"),
                (reader, "INVALID_ARGUMENT"),
                (9999, "NOT_FOUND"),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    register_memfd(dev, "k", os.getpid(), fd)
                assert refused.value.code().name == code, fd
            # the pipe was never opened for reading by the daemon: nothing was taken from it
            os.write(writer, b"x")
            assert os.read(reader, 1) == b"x"
            with pytest.raises(grpc.RpcError) as daemons_own:  # the daemon's stderr: a file of the same user
                register_memfd(dev, "k", daemon.pid, 2)
            assert daemons_own.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            reply = register_memfd(dev, "k", os.getpid(), sealed)
            assert reply.mapped and reply.size == 65536
            with pytest.raises(OSError):
                os.ftruncate(sealed, 1000)  # the seal holds: the daemon's mapping cannot lose its pages
            run_shared(dev, session.id, "k")
            assert np.frombuffer(os.pread(sealed, 40, 32768), np.float32).shape == (10,)
    finally:
        for fd in (unsealed, sealed, reader, writer):
            os.close(fd)


_MEMFD_INTRUDER = """
import os, sys, grpc
from rknn_proto import rknn_pb2, rknn_pb2_grpc
address, pid, fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.setuid(65534)
stub = rknn_pb2_grpc.RknnServerStub(grpc.insecure_channel(address))
try:
    stub.RegisterSharedMemory(rknn_pb2.RegisterSharedMemoryRequest(key="k", memfd=True, pid=pid, fd=fd), timeout=30)
    print("OK")
except grpc.RpcError as exc:
    print(exc.code().name)
"""


@ROOT
def test_another_user_cannot_register_my_memfd(daemons: StartDaemon) -> None:
    daemon = daemons()
    mine = _memfd(65536, fcntl.F_SEAL_SHRINK)
    try:
        intruder = subprocess.run(
            [sys.executable, "-c", _MEMFD_INTRUDER, daemon.address, str(os.getpid()), str(mine)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert intruder.returncode == 0, intruder.stderr
        assert intruder.stdout.strip() == "PERMISSION_DENIED"
        assert held(daemon.pid, "rknn-test") == []
    finally:
        os.close(mine)


def test_a_memfd_sealed_against_writing_is_refused_cleanly(daemons: StartDaemon) -> None:
    daemon = daemons()
    frozen = _memfd(65536, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    try:
        with device(daemon) as dev:
            with pytest.raises(grpc.RpcError) as refused:
                register_memfd(dev, "k", os.getpid(), frozen)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "cannot be mapped" in (refused.value.details() or "")
    finally:
        os.close(frozen)


def test_threads_sharing_a_session_each_get_their_own_outputs(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    frames = [np.full((1, 3, 16, 16), value, np.float32) for value in np.linspace(-2, 2, 8)]
    with device(daemon) as wire, wire.load(cnn) as wired:
        shared_memory.disable(wire)
        want = [wired.run([f])[0].tobytes() for f in frames]
    with device(daemon) as dev, dev.load(cnn) as session:

        def work(i: int) -> bool:
            return all(session.run([frames[i]])[0].tobytes() == want[i] for _ in range(10))

        with ThreadPoolExecutor(len(frames)) as pool:
            assert all(pool.map(work, range(len(frames))))
        assert uses(dev, session.id) == 10 * len(frames)


def test_progress_hears_the_inputs_placed_then_the_outputs_taken(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    events: list[tuple[int, int]] = []
    with device(daemon) as dev, dev.load(cnn) as session:
        session.run([cnn_input()], progress=lambda done, total: events.append((done, total)))
        assert uses(dev, session.id) == 1
    assert events == [(3072, 3072), (3072 + 40, 3072 + 40)]


def test_a_mapped_memfd_gets_the_wires_outputs_and_a_slot_too_small_nothing(
    daemons: StartDaemon, cnn: Path
) -> None:
    """The daemon's runtime writes into a mapped memfd itself (IOBinding): the slot is checked first."""
    daemon = daemons()
    fd = _memfd(65536, 0)
    os.pwrite(fd, b"\xab" * 65536, 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    frame = np.frombuffer(b"\xab" * 3072, np.float32).reshape(1, 3, 16, 16)
    try:
        with device(daemon) as dev, dev.load(cnn) as session, device(daemon) as wire:
            shared_memory.disable(wire)
            with wire.load(cnn) as wired:
                want = wired.run([frame])[0].tobytes()
            assert register_memfd(dev, "k", os.getpid(), fd).mapped
            with pytest.raises(grpc.RpcError) as small:
                run_shared(dev, session.id, "k", out_bytes=39)
            assert small.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert os.pread(fd, 65536, 0) == b"\xab" * 65536  # nothing was written
            run_shared(dev, session.id, "k")  # in place
            assert os.pread(fd, 40, 32768) == want
            header = rknn_pb2.InferenceHeader(
                session_id=session.id,
                inputs=[
                    rknn_pb2.TensorMeta(
                        dtype=rknn_pb2.DATA_TYPE_FLOAT32, shape=[1, 3, 16, 16], byte_length=3072
                    )
                ],
                input_regions=[rknn_pb2.TensorRegion(key="k", offset=0, byte_length=3072)],
                output_regions=[rknn_pb2.TensorRegion(key="k", offset=40001, byte_length=40)],
            )
            dev._stub.RunShared(rknn_pb2.RunRequest(header=header), metadata=dev.metadata, timeout=30)
            assert os.pread(fd, 40, 40001) == want  # a misaligned slot: copied in after the run
    finally:
        os.close(fd)


def test_lent_outputs_are_the_regions_own_bytes_until_the_next_frame(daemons: StartDaemon, cnn: Path) -> None:
    daemon = daemons()
    first, second = (np.full((1, 3, 16, 16), v, np.float32) for v in (-1.0, 1.0))
    with device(daemon) as wire, wire.load(cnn) as wired:
        shared_memory.disable(wire)
        want = [wired.run([f])[0].tobytes() for f in (first, second)]
    assert want[0] != want[1]
    with device(daemon) as dev, dev.load(cnn) as session:
        shared_memory.lend_outputs(session)
        lent = session.run([first])[0]
        assert lent.tobytes() == want[0] and not lent.flags.writeable
        again = session.run([second])[0]
        assert np.shares_memory(lent, again)  # no copy: the next frame's outputs took their place
        assert lent.tobytes() == again.tobytes() == want[1]
        shared_memory.lend_outputs(session, False)
        kept = session.run([first])[0]
        session.run([second])
        assert kept.tobytes() == want[0] and kept.flags.writeable  # a copy of its own
        assert uses(dev, session.id) == 4


def test_large_outputs_copied_out_take_the_memory_of_outputs_the_caller_dropped(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    """A large output copied out of the region goes into memory of the session's earlier outputs that
    nobody holds any more (fresh pages cost a 64 MiB output more than its copy), never into memory an
    output still held is using."""
    model = big_identity(tmp_path / "identity_2mib.onnx", 1 << 19)
    x = np.random.default_rng(3).standard_normal((1, 1 << 19)).astype(np.float32)
    with device(daemons()) as dev, dev.load(model) as session:
        first = session.run([x])[0]
        held_output = session.run([x + 1])[0]  # `first` still held: other memory
        assert not np.shares_memory(first, held_output)
        address = first.__array_interface__["data"][0]
        del first
        again = session.run([x + 2])[0]
        assert again.__array_interface__["data"][0] == address  # the dropped output's memory
        np.testing.assert_array_equal(held_output, x + 1)  # what is held is untouched
        np.testing.assert_array_equal(again, x + 2)
        assert again.flags.writeable and uses(dev, session.id) == 3


def _mapped_from(address: int) -> str:
    """The path of this process's mapping that holds `address` ("" when none names one)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) > 5 else ""
    return ""


def test_input_buffers_are_the_regions_slots_and_run_reads_what_was_written(
    daemons: StartDaemon, cnn: Path
) -> None:
    daemon = daemons()
    values = (-1.0, 0.25, 2.0)
    with device(daemon) as wire, wire.load(cnn) as wired:
        shared_memory.disable(wire)
        plain = shared_memory.input_buffers(wired)
        assert [(b.shape, b.dtype) for b in plain] == [((1, 3, 16, 16), np.float32)]
        want = [wired.run([cnn_input(v)])[0].tobytes() for v in values]
        plain[0][...] = values[0]  # the wire's buffers are plain arrays: run() works on them the same
        assert wired.run(plain)[0].tobytes() == want[0]
    with device(daemon) as dev, dev.load(cnn) as session:
        (buffer,) = shared_memory.input_buffers(session)
        assert _mapped_from(buffer.ctypes.data).startswith("/memfd:rknn-client-")
        for value, expected in zip(values, want, strict=True):
            buffer[...] = value
            assert session.run([buffer])[0].tobytes() == expected  # read as written, each frame
        assert session.run([cnn_input(values[1])])[0].tobytes() == want[1]  # another array: copied in
        assert session.run([buffer])[0].tobytes() == want[1]  # ... into the same slot
        assert uses(dev, session.id) == 5


def test_inputs_of_another_size_move_the_output_slots_and_outputs_follow(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    """A dynamic input's size sets where the outputs' slots start: a frame of another size must read
    its outputs where they are now, not where the last frame's were (its metas are the same)."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
        "pool",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 1, 1])],
    )
    model = save_graph(graph, tmp_path / "pool.onnx")
    rng = np.random.default_rng(3)
    frames = [rng.standard_normal((1, 3, size, size)).astype(np.float32) for size in (4, 32, 4, 8, 32)]
    with device(daemons()) as dev, dev.load(model) as session:
        for frame in frames:
            got = session.run([frame])[0]
            assert np.allclose(got, frame.mean(axis=(2, 3), keepdims=True), atol=1e-5)
        assert uses(dev, session.id) == len(frames)


def test_input_buffers_need_fixed_shapes(daemons: StartDaemon, tmp_path: Path) -> None:
    model = identity_of(tmp_path / "dynamic.onnx", "float32", ("n", 4))  # type: ignore[arg-type]
    with (
        device(daemons()) as dev,
        dev.load(model) as session,
        pytest.raises(InvalidInput, match="dynamic shape"),
    ):
        shared_memory.input_buffers(session)


def test_outputs_of_a_dynamic_batch_axis_take_shared_memory_once_a_frame_showed_their_size(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    """Most exported models have a dynamic batch axis, so their outputs' shapes are dynamic even
    when every frame has the same input: the first frame of an input shape goes by the wire and
    shows the outputs' size, the next ones of that shape go through the region. A frame whose output
    outgrows what was learnt (a model whose output size follows the data) is refused before anything
    is written, and goes by the wire."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("NonZero", ["x"], ["where"])],
        "dynamic",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])],
        [
            helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("where", onnx.TensorProto.INT64, [2, "k"]),
        ],
    )
    model = save_graph(graph, tmp_path / "dynamic.onnx")
    sparse = np.array([[0, 0, 0, 1]] * 2, np.float32)
    dense = np.ones((2, 4), np.float32)
    batch = np.ones((3, 4), np.float32)  # another input shape
    daemon = daemons()
    with device(daemon) as dev, dev.load(model) as session:
        # Each frame, and how many frames have gone by the wire (Run calls) once it is answered.
        for frame, by_wire in [
            (sparse, 1),
            (sparse, 1),
            (sparse, 1),
            (dense, 2),
            (dense, 2),
            (batch, 3),
            (batch, 3),
        ]:
            y, where = session.run([frame])
            assert np.array_equal(y, frame) and np.array_equal(where, np.array(np.nonzero(frame)))
            assert wait_until(lambda want=by_wire: rpcs(daemon, "Run") >= want)
            assert rpcs(daemon, "Run") == by_wire
        assert uses(dev, session.id) == 5  # the region's: four frames and the one refused
