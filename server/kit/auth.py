"""Who may call the daemon: bearer tokens, TLS settings, the listen policy and client identities.

A token file holds one token per line, either `name:token` or a bare token (named "default");
blank lines and `#` comments are skipped. A client sends the token, or its whole line as the file has
it (`name:token`, so `Bearer $(cat auth-token)` works for a one-token file whatever its format): a
token holds no `:`, so the two cannot be confused, and a line's name must be its token's. Tokens are
compared in constant time against every entry, so neither the match nor its position leaks through
timing.
"""

from __future__ import annotations

import hmac
import ssl
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from rknn_server.board.peers import Listener, anonymous_identity, parse_peer
from rknn_server.config.listen import ListenAddress

log = structlog.get_logger("rknn_server.auth")
BEARER_PREFIX = "bearer "
DEFAULT_TOKEN_NAME = "default"
# Shortest token accepted: a guessable token is no protection.
MIN_TOKEN_CHARS = 16


class SecurityConfigError(Exception):
    """The daemon's security settings are unsafe or unusable; the message says which option fixes it."""


class TokenTable:
    """The named tokens a daemon accepts."""

    def __init__(self, entries: Sequence[tuple[str, str]]) -> None:
        self._entries = [(name, token.encode()) for name, token in entries]

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        try:
            text = path.read_text()
            mode = path.stat().st_mode
        except OSError as exc:
            raise SecurityConfigError(f"cannot read the token file --auth-token-file {path}: {exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("token_file_readable_by_others", path=str(path), mode=oct(mode & 0o777))
        entries: list[tuple[str, str]] = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, token = line.partition(":")
            name, token = (name.strip(), token.strip()) if sep else (DEFAULT_TOKEN_NAME, line)
            if len(token) < MIN_TOKEN_CHARS or not name:
                raise SecurityConfigError(
                    f"{path} line {number}: expected 'name:token' or a bare token of at least "
                    f"{MIN_TOKEN_CHARS} characters (make one with: head -c 32 /dev/urandom | base64)"
                )
            entries.append((name, token))
        if not entries:
            raise SecurityConfigError(f"the token file {path} holds no token")
        names = [n for n, _ in entries]
        if len(set(names)) != len(names):
            raise SecurityConfigError(f"the token file {path} repeats a token name: {names}")
        return cls(entries)

    def identify(self, token: str) -> str | None:
        """The name of the entry `token` (a token, or a file line `name:token`) matches, or None;
        compares with every entry in constant time."""
        offered_name, named, secret = token.partition(":")
        offered = (secret.strip() if named else token).encode()
        found: str | None = None
        for name, expected in self._entries:
            same_token = hmac.compare_digest(offered, expected)
            same_name = hmac.compare_digest(offered_name.strip().encode(), name.encode())
            if same_token and (same_name or not named):
                found = name
        return found


def bearer_token(metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
    """The token of an `authorization: Bearer <token>` metadata entry, if any."""
    for key, value in metadata:
        is_bearer = isinstance(value, str) and value[: len(BEARER_PREFIX)].lower() == BEARER_PREFIX
        if key.lower() == "authorization" and is_bearer:
            return str(value)[len(BEARER_PREFIX) :].strip()
    return None


class Unauthenticated(Exception):
    """A call without credentials this daemon accepts; the message says what to send."""


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call, and who each caller is.

    Once a token file or a client CA is configured, every caller on every listener needs a valid token
    or a client certificate, unless `trust_loopback` opens this machine's callers again. A token that
    does not match is refused even then: a wrong token is a mistake or an attack, never anonymous access.
    Without either, every caller is let in (non-loopback listeners then needed --insecure to start).
    """

    tokens: TokenTable | None = None
    client_certificates: bool = False  # mutual TLS: grpc has already verified the certificate
    trust_loopback: bool = False
    # The bound TCP listeners (host, port), added once bound: they complete a local caller's socket address.
    listeners: list[Listener] = field(default_factory=list)

    @property
    def required(self) -> bool:
        return self.tokens is not None or self.client_certificates

    def connection_identity(self, peer: str) -> str:
        """Who a connection's socket says is calling, before any credential is read: what a door
        counts the connection against (and the identity of a tokenless caller)."""
        return anonymous_identity(parse_peer(peer), self.listeners)

    def admit(self, peer: str, token: str | None, certificate_subject: str, anonymous: str = "") -> str:
        """The caller's identity: its token's name, its certificate's subject, else who its socket says
        (`anonymous`, where the door already asked: the lookup is a kernel round trip)."""
        if token is not None and self.tokens is not None:
            name = self.tokens.identify(token)
            if name is None:
                raise Unauthenticated(
                    "the call carries a token this daemon does not accept; send gRPC metadata "
                    "'authorization: Bearer <token>' (rknn_client: token= or RKNN_SERVER_TOKEN)"
                )
            return name
        if certificate_subject and self.client_certificates:
            return certificate_subject
        caller = parse_peer(peer)
        if not self.required or (self.trust_loopback and caller.is_local):
            return anonymous or anonymous_identity(caller, self.listeners)
        wanted = ["a token in gRPC metadata 'authorization: Bearer <token>'"] if self.tokens else []
        wanted += ["a client certificate (mutual TLS)"] if self.client_certificates else []
        raise Unauthenticated(
            f"the call carries no credentials; this daemon wants {' or '.join(wanted)} "
            "(rknn_client: token= or RKNN_SERVER_TOKEN; tls_cert=/tls_key=)"
        )


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the daemon's TLS identity, and the CA that signs client certificates (mutual TLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """The PEM bytes, checked first: grpc reports a bad file only as "failed to bind"."""
        try:
            cert, key = self.cert.read_bytes(), self.key.read_bytes()
            client_ca = self.client_ca.read_bytes() if self.client_ca else None
        except OSError as exc:
            raise SecurityConfigError(f"cannot read a TLS file: {exc}") from exc
        _check_certificates(cert, f"--tls-cert {self.cert}")
        if client_ca is not None:
            _check_certificates(client_ca, f"--tls-client-ca {self.client_ca}")
        try:
            # An encrypted key gets an empty password (and fails) rather than a prompt: grpc cannot use one.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert, self.key, password=lambda: b"")
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise SecurityConfigError(
                    f"--tls-key {self.key} is not the private key of the certificate --tls-cert {self.cert}: "
                    "give the key the certificate was made with"
                ) from None
            raise SecurityConfigError(
                f"--tls-key {self.key} is not an unencrypted PEM private key ({exc.reason or exc})"
            ) from None
        return cert, key, client_ca


def _check_certificates(pem: bytes, option: str) -> None:
    """Raise, naming `option`, unless `pem` holds at least one PEM certificate."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # ValueError: empty or not ASCII
        raise SecurityConfigError(f"{option} is not a PEM certificate ({exc})") from None


def listen_policy(
    listen: Sequence[ListenAddress], authenticated: bool, insecure: bool, tls: bool = False
) -> list[str]:
    """Refuse an unauthenticated non-loopback listener; returns the warnings to show when --insecure allowed one.

    Only a token file or a client CA authenticates: server-only TLS encrypts, but anyone may connect.
    """
    exposed = [a.display() for a in listen if not a.is_loopback]
    if not exposed or authenticated:
        return []
    what = (
        "with server-only TLS, which encrypts but authenticates nobody" if tls else "without authentication"
    )
    if not insecure:
        raise SecurityConfigError(
            f"refusing to listen on {', '.join(exposed)} {what}: anyone who reaches it could run code on "
            "this board. Give --auth-token-file FILE (clients send the token), or --tls-client-ca PEM with "
            "--tls-cert and --tls-key (mutual TLS), or --insecure to accept the risk"
        )
    return [
        f"the daemon listens on {', '.join(exposed)} {what} (--insecure): "
        "anyone who reaches it can load models and run code on this board"
    ]
