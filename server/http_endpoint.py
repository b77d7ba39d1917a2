"""The daemon's small HTTP listener: `/metrics` for Prometheus and the KServe v2 health endpoints.

It runs on the daemon's event loop and is deliberately strict: GET only, one request per connection,
a bounded request line and header block, a deadline for the request head and a cap on connections.
Metrics reveal the models and clients of a board, so the listener follows the gRPC listeners' rules:
a non-loopback address needs the bearer token (or an explicit --insecure), and callers show the token in
an `Authorization: Bearer` header.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from rknn_server.auth import SecurityConfigError, TokenTable, bearer_token
from rknn_server.listen import ListenAddress, parse_listen
from rknn_server.peers import Peer

log = structlog.get_logger("rknn_server.http")

MAX_LINE_BYTES = 4096  # the request line and each header line
MAX_HEADERS = 32
HEAD_TIMEOUT_S = 10.0  # to send the request line and headers
WRITE_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 16
TEXT = "text/plain; charset=utf-8"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True)
class HttpAccess:
    """Who may read the HTTP listener: the daemon's tokens, and whether loopback callers need one too."""

    tokens: TokenTable | None
    token_on_loopback: bool


def admits(access: HttpAccess, loopback: bool, token: str | None) -> bool:
    """The one access decision of the HTTP listener (the same rule the gRPC guard applies)."""
    if access.tokens is None:
        return True
    if token is not None:  # a wrong token is refused, even where no token is needed
        return access.tokens.identify(token) is not None
    return loopback and not access.token_on_loopback


def parse_metrics_listen(text: str) -> ListenAddress:
    """--metrics-listen: a TCP address (HTTP has no abstract-socket clients)."""
    address = parse_listen(text)
    if address.scheme != "tcp":
        raise ValueError(f"metrics listen address {text!r}: expected tcp://HOST:PORT")
    return address


def check_exposure(address: ListenAddress, has_tokens: bool, insecure: bool) -> list[str]:
    """Refuse an open non-loopback metrics listener; the warnings to show when --insecure allowed one."""
    if address.is_loopback or has_tokens:
        return []
    if not insecure:
        raise SecurityConfigError(
            f"refusing to serve metrics on {address.display()} without a token: they name this board's models "
            "and clients. Give --auth-token-file FILE (Prometheus sends 'Authorization: Bearer <token>'), "
            "listen on a loopback address, or --insecure to accept the risk"
        )
    return [f"metrics on {address.display()} are readable by anyone who reaches them (--insecure)"]


@dataclass
class Routes:
    """What the listener answers: the metrics text and the daemon's readiness."""

    metrics: Callable[[], bytes]
    ready: Callable[[], bool]


class HttpEndpoint:
    def __init__(self, routes: Routes, access: HttpAccess) -> None:
        self.routes = routes
        self.access = access
        self._connections = 0

    async def start(self, address: ListenAddress) -> tuple[asyncio.Server, int]:
        server = await asyncio.start_server(self._serve, address.host, address.port, limit=MAX_LINE_BYTES)
        port = int(server.sockets[0].getsockname()[1])
        return server, port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= MAX_CONNECTIONS:
            writer.close()
            return
        self._connections += 1
        try:
            writer.write(_response(*await self._answer(reader, writer)))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            pass  # the client went away, or was too slow to send its request or read the answer
        finally:
            self._connections -= 1
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[int, str, bytes]:
        try:
            method, path, headers = await asyncio.wait_for(_read_head(reader), HEAD_TIMEOUT_S)
        except BadRequest as exc:
            return exc.status, TEXT, f"{exc}\n".encode()
        if method != "GET":
            return 405, TEXT, b"only GET is served\n"
        route = path.partition("?")[0]
        # Health stays open (as gRPC health does), so that load balancers and probes need no token.
        if route == "/v2/health/live":
            return 200, TEXT, b""
        if route == "/v2/health/ready":
            return (200, TEXT, b"") if self.routes.ready() else (503, TEXT, b"")
        peer = writer.get_extra_info("peername")
        loopback = (
            isinstance(peer, tuple) and Peer("ipv6" if ":" in peer[0] else "ipv4", peer[0], peer[1]).is_local
        )
        if not admits(self.access, loopback, bearer_token(list(headers.items()))):
            return 401, TEXT, b"send the daemon's token: 'Authorization: Bearer <token>'\n"
        if route == "/metrics":
            try:
                return 200, METRICS_CONTENT_TYPE, self.routes.metrics()
            except Exception as exc:
                log.error("metrics_failed", error=f"{type(exc).__name__}: {exc}")
                return 500, TEXT, b"the daemon failed to collect its metrics; see its log\n"
        return 404, TEXT, b"not found; this listener serves /metrics, /v2/health/live and /v2/health/ready\n"


def _response(status: int, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    )
    if status == 401:
        head += 'WWW-Authenticate: Bearer realm="rknn_server"\r\n'
    if status == 405:
        head += "Allow: GET\r\n"
    return head.encode() + b"\r\n" + body


async def _read_line(reader: asyncio.StreamReader) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(431, f"a request line or header is longer than {MAX_LINE_BYTES} bytes") from None
    except asyncio.IncompleteReadError:
        raise BadRequest(400, "the request ended before its headers did") from None
    try:
        return raw.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise BadRequest(400, "the request head is not ASCII") from None


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers with lower-case names) of one HTTP/1.x request."""
    words = (await _read_line(reader)).split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/1.") or not words[1].startswith("/"):
        raise BadRequest(400, "expected a request line 'GET /path HTTP/1.1'")
    headers: dict[str, str] = {}
    while True:
        line = await _read_line(reader)
        if not line:
            return words[0], words[1], headers
        if len(headers) >= MAX_HEADERS:
            raise BadRequest(431, f"more than {MAX_HEADERS} headers")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, f"malformed header line {line[:64]!r}")
        headers[name.lower()] = value.strip()


__all__ = ["HttpAccess", "HttpEndpoint", "Routes", "admits", "check_exposure", "parse_metrics_listen"]
