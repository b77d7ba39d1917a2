"""Ctrl-C during a sweep: KeyboardInterrupt as always, and two records of it that cannot be lost.

Python's own handling of SIGINT can miss a sweep. Its handler runs only when the main thread next
checks for pending calls, and raises KeyboardInterrupt in whatever that thread runs then: inside a
finalizer or a weakref callback the exception is printed as "Exception ignored" and dropped, and
the sweep would measure on, its workers running, until killed. So while `watching`, the signal also
writes a byte to a wakeup socket (done by the interpreter's C-level handler, on whichever thread the
kernel picked, at once) and the Python handler sets a flag; the measurement waits on that socket
between windows (drivers.measure) instead of sleeping. A SIGINT the process was started ignoring
is left ignored.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType


class CtrlC:
    """Whether Ctrl-C was pressed while `watching` ran; `pause` waits for it."""

    def __init__(self, wakeup: socket.socket | None = None) -> None:
        self._wakeup = wakeup
        self._handled = 0  # presses Python's handler ran for
        self._seen = 0  # presses read from the wakeup socket

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self._handled += 1  # first: a plain store, which nothing can lose
        if self._handled <= self._seen:
            return  # a press acted on already (its byte came first): no second KeyboardInterrupt
        signal.default_int_handler(signum, frame)

    def pressed(self) -> bool:
        if self._wakeup is not None:
            with contextlib.suppress(BlockingIOError):  # a byte per signal handled: its number
                self._seen += self._wakeup.recv(64).count(signal.SIGINT)
        return bool(self._handled or self._seen)

    def pause(self, seconds: float) -> bool:
        """Wait `seconds`, or less if Ctrl-C comes; whether it came."""
        if self._wakeup is None:
            time.sleep(seconds)
        elif not self.pressed():
            select.select([self._wakeup], [], [], seconds)
        return self.pressed()


UNWATCHED = CtrlC()  # for measurements nobody can interrupt but by KeyboardInterrupt itself


@contextlib.contextmanager
def watching() -> Iterator[CtrlC]:
    """SIGINT recorded by a CtrlC while the block runs. Only the main thread may set handlers, and
    a SIGINT this process was started ignoring (`nohup`, a shell's background job) stays ignored:
    in both cases Ctrl-C is left as it is."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        yield CtrlC()
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    ctrl_c = CtrlC(reader)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = signal.signal(signal.SIGINT, ctrl_c.handle)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(previous_fd)
        reader.close()
        writer.close()


__all__ = ["UNWATCHED", "CtrlC", "watching"]
