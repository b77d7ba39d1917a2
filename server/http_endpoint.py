"""The daemon's small HTTP listener: `/metrics` for Prometheus, the KServe v2 health endpoints and,
when the daemon serves v2, the v2 REST protocol (server/kserve/rest.py).

It runs on the daemon's event loop and is deliberately strict: GET, and POST only where a route takes
a body (v2 inference); one request per connection; a bounded request line and header block, a short
deadline for the request head (--http-head-timeout) and one for the body, a body of at most
`Routes.max_body_bytes` (given a Content-Length, held against the daemon's memory budget), and the
connection gate (server/connections.py): each peer (its local user, else its address) holds at most
--max-http-connections-per-client connections, counted before anything is read, so peers that
connect and say nothing cannot take every slot.
Metrics reveal the models and clients of a board, so the listener follows the gRPC listeners' rules,
with the same code (auth.AccessPolicy.admit, without client certificates: HTTP has no TLS here): a
non-loopback address needs the bearer token (or an explicit --insecure), callers show the token in an
`Authorization: Bearer` header, and a tokenless local caller is `uid:N` as on gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import structlog

from rknn_server.auth import AccessPolicy, SecurityConfigError, Unauthenticated, bearer_token
from rknn_server.connections import Gate, IdleTimeout, Refused, grpc_peer
from rknn_server.errors import ServiceError
from rknn_server.limits import DoorLimits
from rknn_server.listen import ListenAddress, ListenError
from rknn_server.memory import MemoryBudget
from rknn_server.peers import anonymous_identity, parse_peer

log = structlog.get_logger("rknn_server.http")

MAX_LINE_BYTES = 4096  # the request line and each header line
MAX_HEADERS = 32
WRITE_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 60.0  # to send the body, once the head arrived
_BODY_READ_BYTES = 1 << 16
TEXT = "text/plain; charset=utf-8"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    408: "Request Timeout",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


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


@dataclass(frozen=True)
class Request:
    """One request, read whole: route (the path without its query), lower-case headers, the body,
    and who sent it (as on gRPC: the token's name, else `uid:N` for a local caller, else its address)."""

    method: str
    route: str
    headers: dict[str, str]
    body: memoryview
    owner: str


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Routes:
    """What the listener answers: the metrics text, the daemon's readiness and, optionally, a handler
    of further routes (v2 REST) that answers None for a route it does not know."""

    metrics: Callable[[], bytes]
    ready: Callable[[], bool]
    more: Callable[[Request], Awaitable[Reply | None]] | None = None
    posts: Callable[[str], bool] = field(default=lambda route: False)  # routes that take a POST body
    max_body_bytes: int = 0
    body_budget: MemoryBudget | None = None


class HttpEndpoint:
    def __init__(self, routes: Routes, access: AccessPolicy, limits: DoorLimits) -> None:
        self.routes = routes
        self.access = access  # its listeners gain this one's port: a local caller's uid is looked up there
        self.gate = Gate("http", limits, "--http-head-timeout")

    async def start(self, address: ListenAddress) -> tuple[asyncio.Server, int]:
        """Bind `address`; a failure names the flag, the port and what to do (not a bare errno)."""
        try:
            server = await asyncio.start_server(self._serve, address.host, address.port, limit=MAX_LINE_BYTES)
        except OSError as exc:
            why = (
                f"port {address.port} is already in use (another rknn_server, or another program: "
                f"`ss -ltnp 'sport = :{address.port}'` names it)"
                if exc.errno == errno.EADDRINUSE
                else exc.strerror or str(exc)
            )
            raise ListenError(
                f"cannot listen on --metrics-listen {address.display()}: {why}; give --metrics-listen a "
                "free port (port 0 picks one), or stop what holds it"
            ) from None
        port = int(server.sockets[0].getsockname()[1])
        self.access.listeners.append((address.host, port))
        return server, port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = grpc_peer(writer.get_extra_info("peername"))
        try:
            anonymous = anonymous_identity(parse_peer(peer), self.access.listeners)
            with self.gate.admit(anonymous):
                _write(writer, await self._answer(reader, peer, anonymous))
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except Refused as exc:  # answered without reading a byte of the request
            _write(writer, _text(429, str(exc)))
        except (OSError, asyncio.TimeoutError):
            pass  # the client went away, or was too slow to read the answer
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)

    async def _answer(self, reader: asyncio.StreamReader, peer: str, anonymous: str) -> Reply:
        """The reply to one request of `peer`, whose socket names it `anonymous` (before any token)."""
        try:
            method, path, headers = await self.gate.within(_read_head(reader), "request head")
        except BadRequest as exc:
            return _text(exc.status, str(exc))
        except IdleTimeout as exc:
            return _text(408, str(exc))
        route = path.partition("?")[0]
        posts = self.routes.posts(route)
        if method != ("POST" if posts else "GET"):
            allowed = "POST" if posts else "GET"
            return Reply(405, TEXT, f"only {allowed} is served here\n".encode(), (("Allow", allowed),))
        # Health stays open (as gRPC health does), so that load balancers and probes need no token.
        if route == "/v2/health/live":
            return Reply(200, TEXT, b"")
        if route == "/v2/health/ready":
            return Reply(200 if self.routes.ready() else 503, TEXT, b"")
        try:
            owner = self.access.admit(peer, bearer_token(list(headers.items())), "", anonymous)
        except Unauthenticated:
            return Reply(
                401,
                TEXT,
                b"send the daemon's token: 'Authorization: Bearer <token>'\n",
                (("WWW-Authenticate", 'Bearer realm="rknn_server"'),),
            )
        if route == "/metrics":
            try:
                return Reply(200, METRICS_CONTENT_TYPE, self.routes.metrics())
            except Exception as exc:
                log.error("metrics_failed", error=f"{type(exc).__name__}: {exc}")
                return _text(500, "the daemon failed to collect its metrics; see its log")
        if self.routes.more is not None:
            try:
                body = await self._body(reader, headers) if method == "POST" else memoryview(b"")
            except BadRequest as exc:
                return _text(exc.status, str(exc))
            except ServiceError as exc:  # the memory budget
                return _text(429, str(exc))
            reply = await self.routes.more(Request(method, route, headers, body, owner))
            if reply is not None:
                return reply
        return _text(404, "not found; this listener serves /metrics, /v2/health/live and /v2/health/ready")

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> memoryview:
        """The request body, of the Content-Length the head announced (bounded), within its deadline."""
        if "transfer-encoding" in headers:
            raise BadRequest(411, "chunked bodies are not accepted; send a Content-Length")
        length_text = headers.get("content-length", "")
        if not length_text.isdigit() or len(length_text) > 19:
            raise BadRequest(411, "a POST needs a Content-Length header (a decimal byte count)")
        length, limit = int(length_text), self.routes.max_body_bytes
        if length > limit:
            raise BadRequest(
                413, f"the body is {length} bytes, over the limit of {limit} (--max-message-bytes)"
            )
        buffer = np.empty(length, np.uint8)
        if self.routes.body_budget is not None:
            self.routes.body_budget.hold([buffer], "an HTTP request body")
        view = buffer.data.cast("B")
        try:
            await asyncio.wait_for(_read_into(reader, view), BODY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise BadRequest(400, f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None
        return view


async def _read_into(reader: asyncio.StreamReader, view: memoryview) -> None:
    done = 0
    while done < len(view):
        data = await reader.read(min(_BODY_READ_BYTES, len(view) - done))
        if not data:
            raise BadRequest(400, f"the body ended after {done} of its {len(view)} bytes")
        view[done : done + len(data)] = data
        done += len(data)


def _text(status: int, text: str) -> Reply:
    return Reply(status, TEXT, f"{text}\n".encode())


def _write(writer: asyncio.StreamWriter, reply: Reply) -> None:
    """The head, then the body, in two writes: a large body is not copied to be joined to its head
    (writelines joins its buffers on Python < 3.12)."""
    head, body = _response(reply)
    writer.write(head)
    writer.write(body)


def _response(reply: Reply) -> tuple[bytes, bytes]:
    head = (
        f"HTTP/1.1 {reply.status} {_REASONS[reply.status]}\r\nContent-Type: {reply.content_type}\r\n"
        f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n"
    )
    head += "".join(f"{name}: {value}\r\n" for name, value in reply.headers)
    return head.encode() + b"\r\n", reply.body


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


__all__ = [
    "HttpEndpoint",
    "Reply",
    "Request",
    "Routes",
    "check_exposure",
]
