"""Authentication and transport security against real daemons: the listen policy, tokens on every RPC
(streaming ones included), open health/reflection, identities, TLS and mutual TLS."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rknn_client.errors import AuthenticationFailed, ConnectionFailed
from rknn_proto import rknn_pb2, rknn_pb2_grpc
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
    daemon = daemons("--auth-token-file", str(token_file), "--auth-loopback")
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


def test_loopback_stays_open_and_tokens_name_clients(
    daemons: StartDaemon, token_file: Path, cnn: Path
) -> None:
    daemon = daemons("--auth-token-file", str(token_file))
    assert info(daemon).client_identity == "127.0.0.1"
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
    daemon = daemons("--auth-token-file", str(token_file), "--auth-loopback")
    with device(daemon) as anonymous, pytest.raises(AuthenticationFailed):
        anonymous.info()
    monkeypatch.setenv("RKNN_SERVER_TOKEN", OTHER_TOKEN)
    with device(daemon) as bob:
        assert bob.info().client_identity == "bob"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path / "pki"
    d.mkdir()
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
    daemon = daemons(
        "--listen", "tcp://0.0.0.0:0", "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), listen_tcp=False,
    )  # fmt: skip
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
