"""Which path an `RKNN` object takes: the real RKNN-Toolkit2 through the bridge, or the host path.

`RKNN(toolkit=...)`, else `RKNN_CLIENT_TOOLKIT`: `auto` (default: the bridge when a toolkit is found,
else the host path), `bridge` (the toolkit or -1 naming `rknn-client toolkit install`), `host` (never
the toolkit: ONNX Runtime and our int8 emulation). The worker starts at the first toolkit method, so an
object that only runs `.rknn` files on a board never pays for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from rknn_client.toolkit import Missing, ToolkitBridge

ENV_TOOLKIT = "RKNN_CLIENT_TOOLKIT"
MODES = ("auto", "bridge", "host")


class ModeError(ValueError):
    pass


def choose_mode(toolkit: str | None) -> str:
    """The constructor argument wins over the environment; an unknown value is an error, not a guess."""
    given, where = (toolkit, "toolkit") if toolkit is not None else (os.environ.get(ENV_TOOLKIT), ENV_TOOLKIT)
    mode = (given or "auto").strip().lower()
    if mode not in MODES:
        raise ModeError(f"{where}={given!r} is not one of {', '.join(MODES)}")
    return mode


class ToolkitRoute:
    """Starts the bridge lazily (once) and says, per call, where it goes."""

    def __init__(self, mode: str, verbose: bool | str, verbose_file: str | None) -> None:
        self.mode = mode
        self._verbose, self._verbose_file = verbose, verbose_file
        self.bridge: ToolkitBridge | None = None
        self.missing: Missing | None = None

    def get(self, on_missing: Callable[[Missing], None]) -> ToolkitBridge | Missing | None:
        """The bridge; Missing when the toolkit is required but unavailable; None for the host path.
        `on_missing` hears once why a toolkit could not be started."""
        if self.mode == "host":
            return None
        if self.bridge is None and self.missing is None:
            started = ToolkitBridge.start(verbose=self._verbose, verbose_file=self._verbose_file)
            if isinstance(started, Missing):
                self.missing = started
                on_missing(started)
            else:
                self.bridge = started
        if self.bridge is not None:
            return self.bridge
        return self.missing if self.mode == "bridge" else None

    @property
    def started(self) -> bool:
        return self.bridge is not None

    def close(self) -> None:
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            bridge.close()
