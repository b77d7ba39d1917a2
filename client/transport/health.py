"""The standard gRPC health check, asked in one place.

The daemon answers it without credentials, so it tells "something serves gRPC here, and how it feels"
before anything else: `Device.health` (the farm's probe) and the transport's guess whether a bare
HOST:PORT is a daemon both ask through `health_status`.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.ServingStatus.Name(health_pb2.HealthCheckResponse.SERVING)


def health_status(channel: grpc.Channel, timeout: float) -> str:
    """The serving status the server at `channel` reports ("SERVING", "NOT_SERVING", ...); raises
    grpc.RpcError when it does not answer."""
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
