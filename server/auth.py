"""Who may call the daemon: bearer tokens, TLS settings, the listen policy and client identities.

A token file holds one token per line, either `name:token` or a bare token (named "default");
blank lines and `#` comments are skipped. Tokens are compared in constant time against every entry,
so neither the match nor its position leaks through timing.
"""

from __future__ import annotations

import hmac
import ipaddress
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from rknn_server.listen import ListenAddress

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
        """The name of the entry `token` matches, or None; compares with every entry in constant time."""
        offered = token.encode()
        found: str | None = None
        for name, expected in self._entries:
            if hmac.compare_digest(offered, expected):
                found = name
        return found


def bearer_token(metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
    """The token of an `authorization: Bearer <token>` metadata entry, if any."""
    for key, value in metadata:
        is_bearer = isinstance(value, str) and value[: len(BEARER_PREFIX)].lower() == BEARER_PREFIX
        if key.lower() == "authorization" and is_bearer:
            return str(value)[len(BEARER_PREFIX) :].strip()
    return None


def peer_host(peer: str) -> str:
    """The caller's address without the port: "ipv4:10.0.0.2:5555" -> "10.0.0.2"; unix peers -> "local"."""
    if peer.startswith("unix"):
        return "local"
    _, _, rest = peer.partition(":")
    if rest.startswith("["):
        return rest[1:].partition("]")[0]
    return rest.rpartition(":")[0] or rest


def is_local_peer(peer: str) -> bool:
    """A caller on this machine: the abstract socket (adb forward ends there) or a loopback address."""
    host = peer_host(peer)
    if host == "local":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the daemon's TLS identity, and the CA that signs client certificates (mutual TLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        try:
            return (
                self.cert.read_bytes(),
                self.key.read_bytes(),
                self.client_ca.read_bytes() if self.client_ca else None,
            )
        except OSError as exc:
            raise SecurityConfigError(f"cannot read a TLS file: {exc}") from exc


def listen_policy(listen: Sequence[ListenAddress], authenticated: bool, insecure: bool) -> list[str]:
    """Refuse an open non-loopback listener; returns the warnings to show when --insecure allowed one."""
    exposed = [a.display() for a in listen if not a.is_loopback]
    if not exposed or authenticated:
        return []
    if not insecure:
        raise SecurityConfigError(
            f"refusing to listen on {', '.join(exposed)} without authentication: anyone who reaches it could "
            "run code on this board. Give --auth-token-file FILE (clients send the token), or --tls-cert and "
            "--tls-key (with --tls-client-ca for mutual TLS), or --insecure to accept the risk"
        )
    return [
        f"the daemon listens on {', '.join(exposed)} without a token or TLS (--insecure): "
        "anyone who reaches it can load models and run code on this board"
    ]
