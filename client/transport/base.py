"""The transport seam: every way of reaching a daemon ends as a gRPC target string."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

# adb's own variable for the board to use when no serial is given (`adb -s` overrides it).
ENV_ANDROID_SERIAL = "ANDROID_SERIAL"


def _nothing() -> None:
    return None


@dataclass
class Endpoint:
    """A reachable daemon.

    `grpc_target` is what grpc.insecure_channel takes ("127.0.0.1:50515", "unix-abstract:rknn_server").
    `close` undoes whatever reaching it needed (an adb forward, a private daemon); it is idempotent.
    """

    grpc_target: str
    description: str
    kind: str  # "tcp" | "adb" | "private" | "unix"
    close: Callable[[], None] = field(default=_nothing)
    # What names this daemon to `--device` (an adb serial, tcp://HOST:PORT); "" for a private daemon.
    device_id: str = ""
    # The token this daemon was started with for this client alone (a private daemon); sent instead of
    # RKNN_SERVER_TOKEN, which belongs to other daemons.
    token: str = ""


class TransportError(Exception):
    """A daemon could not be reached by the chosen transport; the message says why and what to do."""


def android_serial() -> str | None:
    """The board ANDROID_SERIAL names, as adb itself picks it when no serial is given; None when unset."""
    return os.environ.get(ENV_ANDROID_SERIAL, "").strip() or None
