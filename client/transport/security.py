"""How the client proves who it is: a bearer token on every call, and TLS (optionally mutual) on TCP.

Each setting comes from an argument, else from the environment: RKNN_SERVER_TOKEN, RKNN_SERVER_TLS_CA,
RKNN_SERVER_TLS_CERT, RKNN_SERVER_TLS_KEY. The token travels on every transport; TLS applies to
direct TCP endpoints (adb and the private daemon end at plaintext local sockets on the board/PC).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rknn_client.transport.base import Endpoint, TransportError
from rknn_proto.version import HTTP2_OPTIONS

ENV_TOKEN = "RKNN_SERVER_TOKEN"
ENV_TLS_CA = "RKNN_SERVER_TLS_CA"
ENV_TLS_CERT = "RKNN_SERVER_TLS_CERT"
ENV_TLS_KEY = "RKNN_SERVER_TLS_KEY"


def _path_or_env(value: Path | str | None, env: str) -> Path | None:
    text = str(value) if value is not None else os.environ.get(env, "").strip()
    return Path(text) if text else None


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @classmethod
    def resolve(
        cls,
        token: str | None = None,
        tls_ca: Path | str | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
    ) -> Credentials:
        """Arguments first, then the RKNN_SERVER_* environment variables."""
        return cls(
            token=token if token is not None else (os.environ.get(ENV_TOKEN, "").strip() or None),
            tls_ca=_path_or_env(tls_ca, ENV_TLS_CA),
            tls_cert=_path_or_env(tls_cert, ENV_TLS_CERT),
            tls_key=_path_or_env(tls_key, ENV_TLS_KEY),
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise TransportError("a TLS client certificate needs both tls_cert and tls_key")
        try:
            return grpc.ssl_channel_credentials(
                self.tls_ca.read_bytes() if self.tls_ca else None,
                self.tls_key.read_bytes() if self.tls_key else None,
                self.tls_cert.read_bytes() if self.tls_cert else None,
            )
        except OSError as exc:
            raise TransportError(f"cannot read a TLS file: {exc}") from exc

    def uses_tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._entry = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata: Sequence[tuple[str, str]] = tuple(details.metadata or ())
        return details._replace(metadata=(*metadata, self._entry))

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def open_channel(
    endpoint: Endpoint, credentials: Credentials, options: Sequence[tuple[str, Any]]
) -> grpc.Channel:
    """A channel to the endpoint with TLS (TCP endpoints, when configured) and the token attached;
    `options` come after the transport's own (`HTTP2_OPTIONS`)."""
    options = [*HTTP2_OPTIONS, *options]
    if credentials.uses_tls() and endpoint.kind == "tcp":
        channel = grpc.secure_channel(
            endpoint.grpc_target, credentials.channel_credentials(), options=options
        )
    else:
        channel = grpc.insecure_channel(endpoint.grpc_target, options=options)
    if credentials.token:
        channel = grpc.intercept_channel(channel, _BearerToken(credentials.token))
    return channel
