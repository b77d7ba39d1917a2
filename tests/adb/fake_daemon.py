"""A fake daemon that only answers GetInfo, with chosen versions: for doctor, version and device tests."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from rknn_proto import rknn_pb2, rknn_pb2_grpc


class InfoOnly(rknn_pb2_grpc.RknnServerServicer):
    """Answers GetInfo as a daemon speaking `protocol_version` and accepting clients >= `min_client`."""

    def __init__(self, protocol_version: int, min_client: int, soc: str, board: str) -> None:
        self.reply = rknn_pb2.GetInfoResponse(
            daemon_version="0.0-fake",
            protocol_version=protocol_version,
            min_client_protocol_version=min_client,
            runtime="rknnrt",
            runtime_version="librknnrt 2.3.2",
            driver_version="0.9.8",
            soc=soc,
            board=board,
        )

    def GetInfo(
        self, request: rknn_pb2.GetInfoRequest, context: grpc.ServicerContext
    ) -> rknn_pb2.GetInfoResponse:
        return self.reply


@dataclass
class FakeDaemon:
    socket_name: str
    tcp_port: int
    server: grpc.Server

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"


def start_fake_daemon(
    protocol_version: int, min_client: int | None = None, soc: str = "", board: str = ""
) -> FakeDaemon:
    """A GetInfo-only gRPC server on a fresh abstract socket and a loopback TCP port."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    accepted = protocol_version if min_client is None else min_client
    # The stubs declare every RPC abstract; the fake only needs GetInfo (the rest answer UNIMPLEMENTED).
    servicer = InfoOnly(protocol_version, accepted, soc, board)  # type: ignore[abstract]
    rknn_pb2_grpc.add_RknnServerServicer_to_server(servicer, server)
    name = f"rknn-fake-{uuid.uuid4().hex[:12]}"
    server.add_insecure_port(f"unix-abstract:{name}")
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return FakeDaemon(name, port, server)
