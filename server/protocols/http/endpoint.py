"""The daemon's small HTTP listener: `/metrics` for Prometheus, the KServe v2 health endpoints and,
when the daemon serves v2, the v2 REST protocol (server/protocols/kserve/rest.py).

It runs on the daemon's event loop and speaks HTTP/1.1 through h11 (keep-alive, chunked request
bodies, `Expect: 100-continue`), held to strict bounds: GET, and POST only where a route takes a body
(v2 inference); a bounded request line and header block, a deadline for each request head
(--http-head-timeout, which is also how long a kept-alive connection may idle between requests) and
one for the body; a body of at most `Routes.max_body_bytes`, held against the daemon's memory budget,
refused from its Content-Length before a byte of it is read, and a chunked one refused as soon as
what arrived passes the limit; and the connection gate (server/kit/connections.py): each peer (its
local user, else its address) holds at most --max-http-connections-per-client connections, idle
kept-alive ones included, counted before anything is read, so peers that connect and say nothing
cannot take every slot.
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

import h11
import numpy as np
import structlog

from rknn_server.config.limits import DoorLimits
from rknn_server.config.listen import ListenAddress, ListenError
from rknn_server.core.memory import MemoryBudget
from rknn_server.errors import ServiceError
from rknn_server.kit.auth import AccessPolicy, SecurityConfigError, Unauthenticated, bearer_token
from rknn_server.kit.connections import Gate, IdleTimeout, Refused, grpc_peer

log = structlog.get_logger("rknn_server.http")

MAX_LINE_BYTES = 4096  # the request line and each header line
MAX_HEADERS = 32
MAX_HEAD_BYTES = MAX_LINE_BYTES * (MAX_HEADERS + 1)  # what h11 may buffer of a head not yet complete
WRITE_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 60.0  # to send the body, once the head arrived
LINGER_S = 2.0  # reading past an unread body before closing, so that the reply is not reset away
_READ_BYTES = 1 << 16
TEXT = "text/plain; charset=utf-8"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {
    100: "Continue",
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
    who sent it (as on gRPC: the token's name, else `uid:N` for a local caller, else its address) and
    its connection's peer (gRPC's form, `ipv4:127.0.0.1:PORT`: what shared memory admits by)."""

    method: str
    route: str
    headers: dict[str, str]
    body: memoryview
    owner: str
    peer: str = ""


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


@dataclass
class _Wire:
    """One TCP connection through h11: the peer's bytes read only when h11 needs more (so at most one
    read beyond the event it is parsing is buffered), replies written without joining their bodies."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h11.Connection = field(
        default_factory=lambda: h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    )

    async def event(self) -> h11.Event:
        """The peer's next event (raises h11.RemoteProtocolError for a malformed one)."""
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await self.reader.read(_READ_BYTES))
        assert isinstance(event, h11.Event)  # not PAUSED: only read while a request is being received
        return event

    def request_done(self) -> bool:
        """Whether the request was read to its end, so that the connection can take another: one
        without a body is once h11 sees its end; one whose body was not read closes the connection."""
        if self.conn.their_state is h11.SEND_BODY:
            with contextlib.suppress(h11.RemoteProtocolError):
                self.conn.next_event()
        return self.conn.their_state is h11.DONE

    def send_continue(self) -> None:
        """Tell a client waiting on `Expect: 100-continue` to send the body it announced."""
        if self.conn.they_are_waiting_for_100_continue:
            informational = h11.InformationalResponse(status_code=100, headers=[], reason=_REASONS[100])
            self.writer.write(self.conn.send(informational))

    def send(self, reply: Reply, close: bool) -> None:
        """The head (joined: h11 gives it line by line), then the body as it is, in two writes: a
        large body is not copied to be joined to its head."""
        headers = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body)))]
        headers += [*reply.headers, *([("Connection", "close")] if close else [])]
        response = h11.Response(status_code=reply.status, headers=headers, reason=_REASONS[reply.status])
        self.writer.write(self.conn.send(response))
        for piece in self.conn.send_with_data_passthrough(h11.Data(data=reply.body)) or ():
            self.writer.write(piece)  # reply.body itself (writelines would join on Python < 3.12)
        self.conn.send(h11.EndOfMessage())  # nothing to write after a Content-Length body

    def holds(self, nbytes: int) -> bool:
        """Whether h11 has `nbytes` of the peer's data received and not yet parsed (a small body
        comes in the same read as its head): reading them waits for nothing."""
        return len(self.conn.trailing_data[0]) >= nbytes

    async def drain(self) -> None:
        """Wait until the reply's bytes are handed to the kernel, for at most WRITE_TIMEOUT_S. A
        transport below its low-water mark is not paused, so its drain returns at once: no deadline
        (a task and a timer) for that."""
        transport = self.writer.transport
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]:
            await self.writer.drain()
        else:
            await asyncio.wait_for(self.writer.drain(), WRITE_TIMEOUT_S)

    @property
    def keep_alive(self) -> bool:
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    async def linger(self) -> None:
        """Read past what the peer still sends, for a moment, before closing: closing a socket with
        unread bytes resets it, and the reset can reach the peer before it read the reply."""
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            self.writer.write_eof()
            await asyncio.wait_for(self._discard(), LINGER_S)

    async def _discard(self) -> None:
        while await self.reader.read(_READ_BYTES):
            pass


class HttpEndpoint:
    def __init__(self, routes: Routes, access: AccessPolicy, limits: DoorLimits) -> None:
        self.routes = routes
        self.access = access  # its listeners gain this one's port: a local caller's uid is looked up there
        self.gate = Gate("http", limits, "--http-head-timeout")

    async def start(self, address: ListenAddress) -> tuple[asyncio.Server, int]:
        """Bind `address`; a failure names the flag, the port and what to do (not a bare errno)."""
        try:
            server = await asyncio.start_server(self._serve, address.host, address.port, limit=_READ_BYTES)
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
        """Answer the connection's requests, one after another, until either side closes it (or it
        idles past the head deadline); it holds its slot at the gate all along, idle or not."""
        peer = grpc_peer(writer.get_extra_info("peername"))
        wire = _Wire(reader, writer)
        try:
            anonymous = self.access.connection_identity(peer)
            with self.gate.admit(anonymous):
                kept = False
                while await self._exchange(wire, peer, anonymous, kept):
                    wire.conn.start_next_cycle()
                    kept = True
        except Refused as exc:  # answered without reading a byte of the request
            wire.send(_text(429, str(exc)), close=True)
        except (OSError, asyncio.TimeoutError):
            pass  # the client went away, or was too slow to read the answer
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)

    async def _exchange(self, wire: _Wire, peer: str, anonymous: str, kept: bool) -> bool:
        """Answer one request; whether the connection takes another. The reply (held against the
        memory budget) is let go here, before an idle connection waits for its next request."""
        reply = await self._answer(wire, peer, anonymous, kept)
        if reply is None:
            return False
        done = wire.request_done()
        wire.send(reply, close=not done)
        await wire.drain()
        if wire.keep_alive:
            return True
        if not done:
            await wire.linger()
        return False

    async def _answer(self, wire: _Wire, peer: str, anonymous: str, kept: bool) -> Reply | None:
        """The reply to the next request of `peer`, whose socket names it `anonymous` (before any
        token); None when the peer closed, or a kept-alive connection idled, before a request began."""
        try:
            event = await self.gate.within(wire.event(), "request head")
        except h11.RemoteProtocolError as exc:
            too_long = exc.error_status_hint == 431
            why = (
                f"the request head is longer than {MAX_HEAD_BYTES} bytes"
                if too_long
                else f"malformed request: {_said(exc)}"
            )
            return _text(exc.error_status_hint, why)
        except IdleTimeout as exc:
            if kept and wire.conn.their_state is h11.IDLE and not wire.conn.trailing_data[0]:
                return None  # idle between requests: closed, as keep-alive allows, with nothing to answer
            return _text(408, str(exc))
        if not isinstance(event, h11.Request):
            return None  # ConnectionClosed
        try:
            method, path, headers = _head(event)
        except BadRequest as exc:
            return _text(exc.status, str(exc))
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
                body = await self._body(wire, headers) if method == "POST" else memoryview(b"")
            except BadRequest as exc:
                return _text(exc.status, str(exc))
            except ServiceError as exc:  # the memory budget
                return _text(429, str(exc))
            reply = await self.routes.more(Request(method, route, headers, body, owner, peer))
            if reply is not None:
                return reply
        return _text(404, "not found; this listener serves /metrics, /v2/health/live and /v2/health/ready")

    async def _body(self, wire: _Wire, headers: dict[str, str]) -> memoryview:
        """The request body, of the Content-Length the head announced or chunked, within its limit
        (a Content-Length over it refused before a byte is read, a chunked body as soon as what
        arrived passes it), held against the memory budget and read within its deadline."""
        chunked, limit = "transfer-encoding" in headers, self.routes.max_body_bytes  # h11 takes only chunked
        if chunked and "content-length" in headers:
            raise BadRequest(400, "a request has a Content-Length or Transfer-Encoding: chunked, not both")
        if not chunked and "content-length" not in headers:
            raise BadRequest(411, "a POST needs a Content-Length header or a chunked body")
        length = 0 if chunked else int(headers["content-length"])  # h11 checked its digits
        if length > limit:
            raise BadRequest(
                413, f"the body is {length} bytes, over the limit of {limit} (--max-message-bytes)"
            )
        buffer = self._buffer(min(limit, _READ_BYTES) if chunked else length)
        wire.send_continue()
        if not chunked and wire.holds(length):  # it came whole with the head: nothing to wait for
            return await self._read_body(wire, buffer, length, limit)
        try:
            return await asyncio.wait_for(
                self._read_body(wire, buffer, None if chunked else length, limit), BODY_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            raise BadRequest(400, f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None

    async def _read_body(self, wire: _Wire, buffer: np.ndarray, length: int | None, limit: int) -> memoryview:
        """The body's bytes (`length` of them, None: chunked) into `buffer`; only a chunked body
        outgrows it, into one twice as large, up to the limit."""
        done = 0
        try:
            while not isinstance(event := await wire.event(), h11.EndOfMessage):
                assert isinstance(event, h11.Data)
                end = done + len(event.data)
                if end > len(buffer):
                    if end > limit:
                        raise BadRequest(
                            413, f"the chunked body passed the limit of {limit} bytes (--max-message-bytes)"
                        )
                    grown = self._buffer(min(limit, max(end, 2 * len(buffer))))
                    grown[:done] = buffer[:done]
                    buffer = grown
                buffer[done:end] = np.frombuffer(event.data, np.uint8)
                done = end
        except h11.RemoteProtocolError as exc:
            if length is None:
                raise BadRequest(
                    400, f"the chunked body is malformed or cut after {done} bytes: {_said(exc)}"
                ) from None
            raise BadRequest(400, f"the body ended after {done} of its {length} bytes") from None
        return buffer.data.cast("B")[:done]

    def _buffer(self, size: int) -> np.ndarray:
        buffer = np.empty(size, np.uint8)
        if self.routes.body_budget is not None:
            self.routes.body_budget.hold([buffer], "an HTTP request body")
        return buffer


def _head(request: h11.Request) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers with lower-case names) of a request h11 parsed, held to the bounds
    of a line and of the header count, in ASCII."""
    if len(request.method) + len(request.target) + 10 > MAX_LINE_BYTES:
        raise BadRequest(431, f"the request line is longer than {MAX_LINE_BYTES} bytes")
    if len(request.headers) > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} headers")
    if any(len(name) + len(value) + 2 > MAX_LINE_BYTES for name, value in request.headers):
        raise BadRequest(431, f"a header is longer than {MAX_LINE_BYTES} bytes")
    if not request.target.startswith(b"/"):
        raise BadRequest(400, "expected a request line 'GET /path HTTP/1.1'")
    try:
        headers = {name.decode("ascii"): value.decode("ascii") for name, value in request.headers}
        return request.method.decode("ascii"), request.target.decode("ascii"), headers
    except UnicodeDecodeError:
        raise BadRequest(400, "the request head is not ASCII") from None


def _said(exc: h11.RemoteProtocolError) -> str:
    """h11's reason, short: it may quote what the peer sent."""
    return str(exc)[:100]


def _text(status: int, text: str) -> Reply:
    return Reply(status, TEXT, f"{text}\n".encode())


__all__ = [
    "HttpEndpoint",
    "Reply",
    "Request",
    "Routes",
    "check_exposure",
]
