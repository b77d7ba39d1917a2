"""Per-device credentials from farm.toml.

The daemon's token auth (`rknn_server --auth-token-file`) wants the token on every call; `auth_token`
reads it for a farm device and the client's `Device(token=...)` sends it, as for every other command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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


def auth_token(auth: DeviceAuth | None) -> str | None:
    """The token that authenticates calls to a device (None when it has no auth entry: then the
    client's usual RKNN_SERVER_TOKEN applies)."""
    return None if auth is None else auth.resolve()
