"""Authentication and transport security against real daemons: the listen policy, tokens on every RPC
(streaming ones included), open health/reflection, identities, TLS and mutual TLS."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rknn_client.device import Device
from rknn_client.errors import AuthenticationFailed, ConnectionFailed
from rknn_client.transport.private import start_private_daemon
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import describe_files
from rknn_server.board.peers import anonymous_identity, parse_peer
from tests.reliability.conftest import OTHER_TOKEN, TOKEN, StartDaemon, cnn_input, device, info

HEX = "0" * 64


def _rpcs(stub: rknn_pb2_grpc.RknnServerStub) -> dict[str, object]:
    """One well-formed call of every RPC, each a function of the metadata it sends."""
    manifest = rknn_pb2.ModelManifest(
        digest=HEX, files=[rknn_pb2.ModelFile(name="m.onnx", size=1, sha256=HEX)]
    )
    header = rknn_pb2.UploadModelRequest(header=rknn_pb2.UploadHeader(manifest=manifest, start_offsets=[0]))
    infer = rknn_pb2.InferenceRequest(header=rknn_pb2.InferenceHeader(session_id="x"))
    return {
        "GetInfo": lambda md: stub.GetInfo(rknn_pb2.GetInfoRequest(), metadata=md, timeout=30),
        "PrepareUpload": lambda md: stub.PrepareUpload(
            rknn_pb2.PrepareUploadRequest(manifest=manifest), metadata=md, timeout=30
        ),
        "UploadModel": lambda md: stub.UploadModel(iter([header]), metadata=md, timeout=30),
        "InitRuntime": lambda md: stub.InitRuntime(
            rknn_pb2.InitRuntimeRequest(model_digest=HEX), metadata=md, timeout=30
        ),
        "Inference": lambda md: list(stub.Inference(iter([infer]), metadata=md, timeout=30)),
        "EvalPerf": lambda md: stub.EvalPerf(
            rknn_pb2.EvalPerfRequest(session_id="x"), metadata=md, timeout=30
        ),
        "EvalMemory": lambda md: stub.EvalMemory(
            rknn_pb2.EvalMemoryRequest(session_id="x"), metadata=md, timeout=30
        ),
        "Release": lambda md: stub.Release(rknn_pb2.ReleaseRequest(session_id="x"), metadata=md, timeout=30),
        "KeepAlive": lambda md: stub.KeepAlive(
            rknn_pb2.KeepAliveRequest(session_id="x"), metadata=md, timeout=30
        ),
        "Run": lambda md: stub.Run(rknn_pb2.RunRequest(header=infer.header), metadata=md, timeout=30),
        "DumpLayers": lambda md: list(stub.DumpLayers(iter([infer]), metadata=md, timeout=30)),
        "InferencePipeline": lambda md: list(stub.InferencePipeline(iter([infer]), metadata=md, timeout=30)),
        "Reserve": lambda md: stub.Reserve(rknn_pb2.ReserveRequest(token="short"), metadata=md, timeout=30),
        "RenewReservation": lambda md: stub.RenewReservation(
            rknn_pb2.RenewReservationRequest(token="x"), metadata=md, timeout=30
        ),
        "ReleaseReservation": lambda md: stub.ReleaseReservation(
            rknn_pb2.ReleaseReservationRequest(token="x"), metadata=md, timeout=30
        ),
        "RegisterSharedMemory": lambda md: stub.RegisterSharedMemory(
            rknn_pb2.RegisterSharedMemoryRequest(key="k", name="x"), metadata=md, timeout=30
        ),
        "UnregisterSharedMemory": lambda md: stub.UnregisterSharedMemory(
            rknn_pb2.UnregisterSharedMemoryRequest(key="missing"), metadata=md, timeout=30
        ),
        "SharedMemoryStatus": lambda md: stub.SharedMemoryStatus(
            rknn_pb2.SharedMemoryStatusRequest(key="missing"), metadata=md, timeout=30
        ),
        "RunShared": lambda md: stub.RunShared(
            rknn_pb2.RunRequest(header=infer.header), metadata=md, timeout=30
        ),
        "OpenDoorbell": lambda md: stub.OpenDoorbell(
            rknn_pb2.OpenDoorbellRequest(header=infer.header), metadata=md, timeout=30
        ),
    }


def test_non_loopback_listen_without_auth_is_refused_naming_the_options(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rknn_server", "--listen", "tcp://0.0.0.0:0", "--model-cache", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    for option in ("--auth-token-file", "--tls-cert", "--tls-key", "--insecure"):
        assert option in result.stderr
    assert "listening on" not in result.stdout


def test_insecure_is_explicit_and_reported(daemons: StartDaemon) -> None:
    daemon = daemons("--listen", "tcp://0.0.0.0:0", "--insecure", listen_tcp=False)
    reply = info(daemon)
    assert reply.insecure and not reply.auth_required
    assert any("--insecure" in w for w in reply.warnings)
    assert "insecure_configuration" in daemon.log_text()


def test_every_rpc_needs_the_token_streaming_ones_included(daemons: StartDaemon, token_file: Path) -> None:
    daemon = daemons("--auth-token-file", str(token_file))  # on loopback: it needs the token there too
    with grpc.insecure_channel(daemon.address) as channel:
        calls = _rpcs(rknn_pb2_grpc.RknnServerStub(channel))
        service = rknn_pb2.DESCRIPTOR.services_by_name["RknnServer"]
        assert set(calls) == set(service.methods_by_name), "every RPC of the contract is covered"
        for metadata in (
            (),
            (("authorization", "Bearer wrong-token-000000000000"),),
            (("authorization", TOKEN),),
        ):
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as caught:
                    call(metadata)  # type: ignore[operator]
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        good = (("authorization", f"Bearer {TOKEN}"),)
        for name, call in calls.items():
            if name == "GetInfo":
                assert call(good).client_identity == "alice"  # type: ignore[operator]
                continue
            with pytest.raises(grpc.RpcError) as caught:
                call(good)  # type: ignore[operator]
            assert caught.value.code() != grpc.StatusCode.UNAUTHENTICATED, name
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    probe = subprocess.run(
        [sys.executable, "-m", "rknn_server", "health", daemon.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr


def test_tokens_name_clients_and_a_session_answers_only_its_owner(
    daemons: StartDaemon, token_file: Path, cnn: Path
) -> None:
    daemon = daemons("--auth-token-file", str(token_file))
    assert info(daemon, TOKEN).client_identity == "alice"
    assert info(daemon, OTHER_TOKEN).client_identity == "bob"
    with device(daemon, token=TOKEN) as alice, device(daemon, token=OTHER_TOKEN) as bob:
        assert alice.info().auth_required
        session = alice.load(cnn)
        assert session.run([cnn_input()])[0].shape == (1, 10)
        with pytest.raises(grpc.RpcError) as caught:
            bob._stub.KeepAlive(rknn_pb2.KeepAliveRequest(session_id=session.id), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # another client's session is not bob's
        session.release()


def test_client_takes_the_token_from_the_environment(
    daemons: StartDaemon, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = daemons("--auth-token-file", str(token_file))
    with device(daemon) as anonymous, pytest.raises(AuthenticationFailed):
        anonymous.info()
    monkeypatch.setenv("RKNN_SERVER_TOKEN", OTHER_TOKEN)
    with device(daemon) as bob:
        assert bob.info().client_identity == "bob"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}-cn",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        ext = d / f"{name}.ext"
        ext.write_text(extra + "\n")
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey",
                 str(d / "ca.key"), "-CAcreateserial", "-days", "2", "-out", str(d / f"{name}.pem"),
                 *(("-extfile", str(ext)) if extra else ()))  # fmt: skip
    return d


def test_mutual_tls_names_the_client_by_its_certificate(daemons: StartDaemon, pki: Path, cnn: Path) -> None:
    socket_name = _abstract_name()
    daemon = daemons(
        "--listen", "tcp://0.0.0.0:0", "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), "--listen", f"unix-abstract:{socket_name}", listen_tcp=False,
    )  # fmt: skip
    assert _who(f"unix-abstract:{socket_name}") == "UNAUTHENTICATED", (
        "a client CA closes the plaintext socket too"
    )
    port = daemon.address.rsplit(":", 1)[1]
    url = f"tcp://127.0.0.1:{port}"
    daemon.address = f"127.0.0.1:{port}"
    with device(daemon, tls_ca=pki / "ca.pem") as no_cert, pytest.raises(ConnectionFailed):
        no_cert.info()
    client = {"tls_ca": pki / "ca.pem", "tls_cert": pki / "client.pem", "tls_key": pki / "client.key"}
    with device(daemon, **client) as dev:
        reply = dev.info()
        assert reply.tls and not reply.insecure
        assert "client-cn" in reply.client_identity
        with dev.load(cnn) as session:
            assert session.run([cnn_input()])[0].shape == (1, 10)
    tls_args = ["--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "client.pem"), "--tls-key", str(pki / "client.key")]  # fmt: skip
    probe = subprocess.run(
        [sys.executable, "-m", "rknn_server", "health", url, *tls_args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "rknn_server", "health", url], capture_output=True, text=True, timeout=60
    )
    assert plain.returncode == 1


def _who(target: str, token: str | None = None) -> str:
    """GetInfo's client_identity at `target`, or the status code's name when the call is refused."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(target) as channel:
        try:
            reply = rknn_pb2_grpc.RknnServerStub(channel).GetInfo(
                rknn_pb2.GetInfoRequest(), metadata=metadata, timeout=30
            )
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return str(reply.client_identity)


def _abstract_name() -> str:
    return f"rknn-test-{os.getpid()}-{secrets.token_hex(4)}"


def test_a_token_file_applies_on_loopback_and_the_abstract_socket(
    daemons: StartDaemon, token_file: Path
) -> None:
    socket_name = _abstract_name()
    daemon = daemons("--auth-token-file", str(token_file), "--listen", f"unix-abstract:{socket_name}")
    for target in (daemon.address, f"unix-abstract:{socket_name}"):
        assert _who(target) == "UNAUTHENTICATED", target
        assert _who(target, "wrong-token-0000000000000000") == "UNAUTHENTICATED", target
        assert _who(target, TOKEN) == "alice", target


def test_trust_loopback_opens_this_machine_but_a_wrong_token_is_still_refused(
    daemons: StartDaemon, token_file: Path
) -> None:
    socket_name = _abstract_name()
    daemon = daemons(
        "--auth-token-file", str(token_file), "--trust-loopback", "--listen", f"unix-abstract:{socket_name}"
    )
    assert _who(daemon.address) == f"uid:{os.getuid()}"  # a local caller is its user on this machine
    assert _who(f"unix-abstract:{socket_name}") == "unix-socket"
    for target in (daemon.address, f"unix-abstract:{socket_name}"):
        assert _who(target, "wrong-token-0000000000000000") == "UNAUTHENTICATED", target
        assert _who(target, OTHER_TOKEN) == "bob", target
    assert any("--trust-loopback" in w for w in info(daemon).warnings)


def test_the_deprecated_auth_loopback_flag_is_accepted_and_does_nothing(
    daemons: StartDaemon, token_file: Path
) -> None:
    daemon = daemons("--auth-token-file", str(token_file), "--auth-loopback")
    assert _who(daemon.address) == "UNAUTHENTICATED"
    assert _who(daemon.address, TOKEN) == "alice"
    assert "deprecated_option" in daemon.log_text()


async def _peers_seen_by_a_live_server(targets: list[str]) -> list[str]:
    """The peer strings grpc gives a server for one call to each of `targets` ("{port}" is filled in)."""
    seen: list[str] = []

    def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.append(context.peer())
        return b""

    method = grpc.unary_unary_rpc_method_handler(handler)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("peer.Echo", {"Call": method})])
    ports = [server.add_insecure_port(t.format(port=0)) for t in targets]
    await server.start()
    try:
        for target, port in zip(targets, ports, strict=True):
            async with grpc.aio.insecure_channel(target.format(port=port)) as channel:
                await channel.unary_unary("/peer.Echo/Call")(b"", timeout=30)
    finally:
        await server.stop(None)
    return seen


def test_peer_strings_of_a_live_grpc_server_parse_as_local_callers() -> None:
    name = _abstract_name()
    targets = ["127.0.0.1:{port}", f"unix-abstract:{name}"]
    if socket.has_ipv6:
        targets.append("[::1]:{port}")
    seen = asyncio.run(_peers_seen_by_a_live_server(targets))
    parsed = [parse_peer(peer) for peer in seen]
    assert all(peer.is_local for peer in parsed), seen
    assert re.fullmatch(r"127\.0\.0\.1:\d+", parsed[0].connection()), seen[0]
    assert parsed[1].family == "unix" and parsed[1].connection() == "unix-socket", seen[1]
    if socket.has_ipv6:
        assert seen[2].startswith("ipv6:%5B::1%5D:"), "grpc URL-escapes the brackets"
        assert parsed[2].host == "::1" and re.fullmatch(r"\[::1\]:\d+", parsed[2].connection()), seen[2]


@pytest.mark.parametrize(
    ("peer", "local", "connection"),
    [
        ("ipv4:10.0.0.2:5555", False, "10.0.0.2:5555"),
        ("ipv4:127.8.9.10:1", True, "127.8.9.10:1"),
        ("ipv6:%5B2001:db8::1%5D:443", False, "[2001:db8::1]:443"),
        ("ipv6:%5B::ffff:127.0.0.1%5D:80", True, "[::ffff:127.0.0.1]:80"),
        ("ipv6:%5B::ffff:10.0.0.1%5D:80", False, "[::ffff:10.0.0.1]:80"),
        ("unix:/run/rknn.sock", True, "unix-socket"),
        ("unix-abstract:rknn_server", True, "unix-socket"),
        ("vsock:3:5000", False, "vsock:3:5000"),
        ("", False, ""),
    ],
)
def test_remote_and_odd_peer_strings_are_not_local(peer: str, local: bool, connection: str) -> None:
    assert parse_peer(peer).is_local is local
    assert parse_peer(peer).connection() == connection


def test_a_local_caller_the_kernel_cannot_place_is_its_connection() -> None:
    """Without a listener to complete its socket's address, the uid lookup finds nothing: one connection."""
    assert anonymous_identity(parse_peer("ipv4:127.0.0.1:40000"), []) == "127.0.0.1:40000"
    assert anonymous_identity(parse_peer("ipv6:%5B::1%5D:40000"), [("::1", 1)]) == "[::1]:40000"
    assert anonymous_identity(parse_peer("ipv4:10.1.2.3:40000"), []) == "10.1.2.3"


_PORT_TAKER = """
import os, socket, sys
os.setuid(65534)
with socket.socket() as client:
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    client.bind(("127.0.0.1", int(sys.argv[1])))
    client.connect(("127.0.0.1", int(sys.argv[2])))
    print("connected", flush=True)
    sys.stdin.read()
"""


def test_a_port_reused_by_another_users_connection_is_that_users() -> None:
    """The lookups worked out per peer string are kept (the same string, every call of a connection);
    the owner never is: once a connection closes, another local user may connect from its port, and
    must not inherit the first one's identity (its sessions, its limits)."""
    if os.geteuid() != 0:
        pytest.skip("connecting as a second local user needs root (the taker drops to uid 65534)")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listeners = [("127.0.0.1", listener.getsockname()[1])]
        first = socket.socket()
        first.bind(("127.0.0.1", 0))
        first.connect(listeners[0])
        port = first.getsockname()[1]
        accepted, _ = listener.accept()
        peer = parse_peer(f"ipv4:127.0.0.1:{port}")
        assert anonymous_identity(peer, listeners) == f"uid:{os.getuid()}"
        first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # reset: no TIME_WAIT
        first.close()
        accepted.close()
        taker = subprocess.Popen(
            [sys.executable, "-c", _PORT_TAKER, str(port), str(listeners[0][1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert taker.stdout is not None and taker.stdout.readline() == "connected\n"
            second, _ = listener.accept()
            with second:
                assert anonymous_identity(parse_peer(f"ipv4:127.0.0.1:{port}"), listeners) == "uid:65534"
        finally:
            taker.kill()
            taker.wait(30)


def test_ipv6_loopback_is_loopback(daemons: StartDaemon, token_file: Path) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    daemon = daemons(
        "--auth-token-file",
        str(token_file),
        "--trust-loopback",
        "--listen",
        "tcp://[::1]:0",
        listen_tcp=False,
    )
    assert daemon.address.startswith("[::1]:")
    assert _who(daemon.address) == f"uid:{os.getuid()}"
    assert _who(daemon.address, "wrong-token-0000000000000000") == "UNAUTHENTICATED"


_SESSION_RPCS = (
    "Inference",
    "Run",
    "DumpLayers",
    "InferencePipeline",
    "EvalPerf",
    "EvalMemory",
    "KeepAlive",
    "Release",
)


_INTRUDER = """
import json, os, sys, grpc
from rknn_proto import rknn_pb2, rknn_pb2_grpc
os.setuid(int(sys.argv[3]))  # everything is imported: from here on, another user of this machine
stub = rknn_pb2_grpc.RknnServerStub(grpc.insecure_channel(sys.argv[1]))
def calls(sid):
    header = rknn_pb2.InferenceHeader(session_id=sid)
    frame = rknn_pb2.InferenceRequest(header=header)
    return {
        "Inference": lambda: list(stub.Inference(iter([frame]), timeout=30)),
        "Run": lambda: stub.Run(rknn_pb2.RunRequest(header=header), timeout=30),
        "DumpLayers": lambda: list(stub.DumpLayers(iter([frame]), timeout=30)),
        "InferencePipeline": lambda: list(stub.InferencePipeline(iter([frame]), timeout=30)),
        "EvalPerf": lambda: stub.EvalPerf(rknn_pb2.EvalPerfRequest(session_id=sid), timeout=30),
        "EvalMemory": lambda: stub.EvalMemory(rknn_pb2.EvalMemoryRequest(session_id=sid), timeout=30),
        "KeepAlive": lambda: stub.KeepAlive(rknn_pb2.KeepAliveRequest(session_id=sid), timeout=30),
        "Release": lambda: stub.Release(rknn_pb2.ReleaseRequest(session_id=sid), timeout=30),
    }
answers = {}
for label, sid in (("theirs", sys.argv[2]), ("unknown", "f" * 32)):
    for name, call in calls(sid).items():
        try:
            call()
            answers[f"{label} {name}"] = "OK"
        except grpc.RpcError as exc:
            answers[f"{label} {name}"] = f"{exc.code().name} {exc.details().replace(sid, '<id>')}"
print(json.dumps(answers))
"""


@pytest.mark.parametrize("auth", ["none", "trust-loopback"])
def test_another_local_user_cannot_use_or_release_a_session(
    daemons: StartDaemon, token_file: Path, cnn: Path, auth: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("calling as a second local user needs root (the intruder drops to uid 65534)")
    daemon = daemons(*(() if auth == "none" else ("--auth-token-file", str(token_file), "--trust-loopback")))
    with device(daemon) as owner, owner.load(cnn) as session:
        intruder = subprocess.run(
            [sys.executable, "-c", _INTRUDER, daemon.address, session.id, "65534"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert intruder.returncode == 0, intruder.stderr
        answers = json.loads(intruder.stdout)
        assert set(answers) == {f"{who} {rpc}" for who in ("theirs", "unknown") for rpc in _SESSION_RPCS}
        for rpc in _SESSION_RPCS:
            # Another client's session id gets the very answer an unknown id gets: ids cannot be probed.
            assert answers[f"theirs {rpc}"].startswith("NOT_FOUND "), (rpc, answers[f"theirs {rpc}"])
            assert answers[f"theirs {rpc}"] == answers[f"unknown {rpc}"], rpc
        assert session.run([cnn_input()])[0].shape == (1, 10)  # the owner's session is untouched


_SLOT_TAKER = """
import hashlib, os, sys, grpc
from rknn_proto import rknn_pb2, rknn_pb2_grpc
from rknn_proto.manifest import FileEntry, manifest_digest
model = bytes.fromhex(sys.stdin.read())
os.setuid(int(sys.argv[3]))
stub = rknn_pb2_grpc.RknnServerStub(grpc.insecure_channel(sys.argv[1]))
# Another's upload is not the intruder's: it sends the bytes itself.
entry = FileEntry("cnn.onnx", len(model), hashlib.sha256(model).hexdigest())
files = [rknn_pb2.ModelFile(name=entry.name, size=entry.size, sha256=entry.sha256)]
header = rknn_pb2.UploadHeader(manifest=rknn_pb2.ModelManifest(digest=manifest_digest([entry]), files=files))
header.start_offsets.append(0)
chunk = rknn_pb2.UploadChunk(file_index=0, offset=0, data=model)
stub.UploadModel(iter([rknn_pb2.UploadModelRequest(header=header), rknn_pb2.UploadModelRequest(chunk=chunk)]), timeout=60)
for _ in range(3):
    try:
        stub.InitRuntime(rknn_pb2.InitRuntimeRequest(model_digest=sys.argv[2]), timeout=60)
        print("OK")
    except grpc.RpcError as exc:
        print(exc.code().name, exc.details())
"""


def test_one_local_user_cannot_take_another_users_session_slots(daemons: StartDaemon, cnn: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("calling as a second local user needs root (the intruder drops to uid 65534)")
    daemon = daemons("--max-sessions", "4", "--max-sessions-per-client", "2")
    with device(daemon) as owner:
        owner.load(cnn).release()  # the model is cached: the intruder uploads it too, then opens it by digest
        taker = subprocess.run(
            [sys.executable, "-c", _SLOT_TAKER, daemon.address, describe_files([cnn]).digest, "65534"],
            input=cnn.read_bytes().hex(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        answers = taker.stdout.splitlines()
        assert answers[:2] == ["OK", "OK"], taker.stdout + taker.stderr
        assert answers[2].startswith("RESOURCE_EXHAUSTED") and "max_sessions_per_client=2" in answers[2]
        assert info(daemon).open_sessions == 2  # the intruder's, still open
        with owner.load(cnn) as first, owner.load(cnn) as second:  # the owner's share is whole
            assert first.run([cnn_input()])[0].shape == second.run([cnn_input()])[0].shape == (1, 10)


def test_the_private_daemon_serves_only_the_client_that_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    endpoint = start_private_daemon()
    try:
        pid = int(endpoint.description.split("pid ")[1].split(")")[0])
        command_line = psutil.Process(pid).cmdline()
        assert endpoint.token and all(endpoint.token not in arg for arg in command_line)
        token_path = Path(command_line[command_line.index("--auth-token-file") + 1])
        assert not token_path.parent.exists(), "the token file is removed once the daemon listens"
        assert _who(endpoint.grpc_target) == "UNAUTHENTICATED"
        assert _who(endpoint.grpc_target, "wrong-token-0000000000000000") == "UNAUTHENTICATED"
        with Device(endpoint) as own:
            assert own.info().client_identity == "private-client"
    finally:
        endpoint.close()


def test_tls_without_a_client_ca_is_not_authentication(
    daemons: StartDaemon, pki: Path, tmp_path: Path
) -> None:
    tls = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "rknn_server",
            "--listen",
            "tcp://0.0.0.0:0",
            *tls,
            "--model-cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "authenticates nobody" in refused.stderr and "--tls-client-ca" in refused.stderr
    assert "listening on" not in refused.stdout
    daemon = daemons("--listen", "tcp://0.0.0.0:0", *tls, "--insecure", listen_tcp=False)
    daemon.address = f"127.0.0.1:{daemon.address.rsplit(':', 1)[1]}"
    with device(daemon, tls_ca=pki / "ca.pem") as anyone:  # no token, no client certificate
        reply = anyone.info()
    assert reply.tls and reply.insecure and not reply.auth_required
    assert any("authenticates nobody" in w for w in reply.warnings)


def _start_error(tmp_path: Path, *args: str) -> str:
    """Start a daemon that must refuse to start; returns its stderr, checked to be one line."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rknn_server",
            "--runtime",
            "host",
            "--model-cache",
            str(tmp_path / "cache"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "listening on" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rknn_server: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("mismatched key", r"--tls-key \S+client\.key is not the private key of .*--tls-cert \S+server\.pem"),
        ("garbage certificate", r"--tls-cert \S+garbage\.pem is not a PEM certificate"),
        ("garbage key", r"--tls-key \S+garbage\.pem is not an unencrypted PEM private key"),
        ("garbage client CA", r"--tls-client-ca \S+garbage\.pem is not a PEM certificate"),
    ],
)
def test_a_tls_misconfiguration_is_one_clear_line(
    pki: Path, tmp_path: Path, case: str, expected: str
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    cert, key, ca = pki / "server.pem", pki / "server.key", pki / "ca.pem"
    files = {
        "mismatched key": (cert, pki / "client.key", ca),
        "garbage certificate": (garbage, key, ca),
        "garbage key": (cert, garbage, ca),
        "garbage client CA": (cert, key, garbage),
    }[case]
    options = ("--tls-cert", "--tls-key", "--tls-client-ca")
    args = [arg for option, path in zip(options, files, strict=True) for arg in (option, str(path))]
    assert re.search(expected, _start_error(tmp_path, "--listen", "tcp://127.0.0.1:0", *args))


def test_a_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = _start_error(tmp_path, "--listen", f"tcp://127.0.0.1:{port}")
    assert (
        line
        == f"rknn_server: cannot listen on tcp://127.0.0.1:{port}: the address is already in use; fix --listen"
    )


def test_an_abstract_socket_in_use_is_one_clear_line(tmp_path: Path) -> None:
    name = _abstract_name()
    with socket.socket(socket.AF_UNIX) as holder:
        holder.bind("\0" + name)
        line = _start_error(tmp_path, "--listen", f"unix-abstract:{name}")
    assert (
        line
        == f"rknn_server: cannot listen on unix-abstract:{name}: the address is already in use; fix --listen"
    )
