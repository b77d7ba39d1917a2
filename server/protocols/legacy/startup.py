"""Whether and where the daemon serves the legacy protocol, and starting it."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass, field

import structlog

from rknn_server.core.data_plane import DataPlane
from rknn_server.protocols.legacy.connection import LegacyLimits
from rknn_server.protocols.legacy.layouts import Layout
from rknn_server.protocols.legacy.listener import DEFAULT_PLACES, LegacyListener, parse_place

log = structlog.get_logger("rknn_server.legacy")
PROCESS_NAME = b"rknn_server"
_PR_SET_NAME = 15


@dataclass(frozen=True)
class LegacyPlan:
    places: tuple[str, ...] = ()
    explicit: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)


def plan(requested: tuple[str, ...] | None, on_board: bool, authenticated: bool) -> LegacyPlan:
    """requested: None for the default (on a real board, unless a token file is configured), () for off."""
    if requested is None:
        if not on_board:
            return LegacyPlan()
        if authenticated:
            return LegacyPlan(
                warnings=(
                    "the RKNN-Toolkit2 (legacy) listener is off because a token file is configured and that "
                    "protocol has no authentication; pass --legacy-listen to serve it anyway",
                )
            )
        return LegacyPlan(DEFAULT_PLACES)
    warnings: tuple[str, ...] = ()
    if requested and authenticated:
        warnings = (
            f"the RKNN-Toolkit2 (legacy) listener on {', '.join(requested)} has no authentication: anyone who "
            "can reach those local sockets (through adb, for one) uses the daemon without a token",
        )
    return LegacyPlan(requested, True, warnings)


def name_process() -> None:
    """The toolkit looks for the board daemon with `ps -A | grep rknn_server`: name this process so."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(PROCESS_NAME), 0, 0, 0)


async def start(
    plan_: LegacyPlan, plane: DataPlane, limits: LegacyLimits, layout: Layout
) -> tuple[LegacyListener, list[str]]:
    """Listen on the planned places; an explicit place that fails is an error, a default one a warning."""
    listener = LegacyListener(plane, limits, layout)
    bound = []
    for text in plan_.places:
        place = parse_place(text)
        try:
            await listener.listen(place)
        except OSError as exc:
            if plan_.explicit:
                await listener.close()
                raise OSError(f"cannot serve the toolkit protocol on {text}: {exc.strerror or exc}") from None
            log.warning("legacy_listen_skipped", place=text, error=exc.strerror or str(exc))
            continue
        bound.append(place.display())
    if bound:
        name_process()
    return listener, bound
