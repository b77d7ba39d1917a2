"""Ctrl-C during a sweep: KeyboardInterrupt as always, and a flag that outlives it.

Python raises KeyboardInterrupt in whatever the main thread runs when it handles the signal. When
that is a finalizer or a weakref callback (the garbage collector runs them on whichever thread
triggers it, and a sweep's workers make plenty of garbage), the exception is printed as "Exception
ignored" and lost: the sweep would measure on, its workers running, until killed. So the handler
also sets a flag, and the measurement checks it between windows (drivers.measure).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class CtrlC:
    """Whether Ctrl-C was pressed while `watching` ran."""

    def __init__(self) -> None:
        self.pressed = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True  # first: a plain store, which nothing can lose
        signal.default_int_handler(signum, frame)


@contextlib.contextmanager
def watching() -> Iterator[CtrlC]:
    """SIGINT handled by a CtrlC while the block runs (only the main thread may set a handler:
    elsewhere the flag stays down and Ctrl-C works as before)."""
    ctrl_c = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    previous = signal.signal(signal.SIGINT, ctrl_c.handle)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)


__all__ = ["CtrlC", "watching"]
