"""Per-device credentials from farm.toml, and the one place they are turned into call metadata.

The daemon's token auth (`rknn_server --auth-token-file`) expects gRPC metadata
`authorization: Bearer <token>`. `auth_metadata` is the hook that produces it for a farm device;
once the client API takes a token itself (`connect(..., token=...)`), that is where to switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AUTHORIZATION_METADATA_KEY = "authorization"


class AuthError(Exception):
    """A device's credentials cannot be read."""


@dataclass(frozen=True)
class DeviceAuth:
    """Either a literal token or a file holding one (read at connect time, so rotation works)."""

    token: str | None = None
    token_file: Path | None = None

    def resolve(self) -> str:
        if self.token:
            return self.token
        if self.token_file is None:
            raise AuthError("the auth entry names neither a token nor a token_file")
        try:
            text = self.token_file.expanduser().read_text().strip()
        except OSError as exc:
            raise AuthError(f"cannot read the token file {self.token_file}: {exc}") from exc
        if not text:
            raise AuthError(f"the token file {self.token_file} is empty")
        return text


def auth_metadata(auth: DeviceAuth | None) -> tuple[tuple[str, str], ...]:
    """The metadata that authenticates calls to a device (none when it has no auth entry)."""
    if auth is None:
        return ()
    return ((AUTHORIZATION_METADATA_KEY, f"Bearer {auth.resolve()}"),)
