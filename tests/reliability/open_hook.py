"""Hold another process inside its open() of a file, for as long as a test needs: fanotify permission
events (FAN_OPEN_PERM), which the kernel makes the opener wait on until this process answers.

That turns a race ("swap the folder while the daemon reads it") into a certain order: the daemon has
resolved the file it opens and waits; the test changes the folder; the open goes on. Linux only, and
it needs CAP_SYS_ADMIN (root in a container that keeps it); `available()` says whether it works here.
The callback runs in the hook's thread and must not open files in the watched folder (its own open
would wait on itself).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

_FAN_CLOEXEC, _FAN_CLASS_CONTENT = 0x01, 0x04
_FAN_MARK_ADD = 0x01
_FAN_OPEN_PERM, _FAN_EVENT_ON_CHILD = 0x00010000, 0x08000000
_FAN_ALLOW = 0x01
_AT_FDCWD = -100
_EVENT = struct.Struct("=IBBHQii")  # struct fanotify_event_metadata
_RESPONSE = struct.Struct("=iI")  # struct fanotify_response

OnOpen = Callable[[str, int], None]  # (name of the file opened, opener's pid)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    return libc


def _init() -> int:
    fd = _libc().fanotify_init(_FAN_CLASS_CONTENT | _FAN_CLOEXEC, os.O_RDONLY | os.O_LARGEFILE)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "fanotify_init")
    return int(fd)


def available() -> str:
    """Empty when the hook works here, else why not (for a skip)."""
    try:
        os.close(_init())
    except (OSError, AttributeError) as exc:
        return f"fanotify permission events are not available here ({exc})"
    return ""


@contextlib.contextmanager
def hold_opens(folder: Path, on_open: OnOpen) -> Iterator[None]:
    """While inside, every open of a file in `folder` (the folder's inode: it may be renamed) waits
    for `on_open(name, pid)` to return; then the open goes on."""
    fan = _init()
    stop_r, stop_w = os.pipe()
    try:
        if _libc().fanotify_mark(
            fan, _FAN_MARK_ADD, _FAN_OPEN_PERM | _FAN_EVENT_ON_CHILD, _AT_FDCWD, os.fsencode(folder)
        ):
            raise OSError(ctypes.get_errno(), "fanotify_mark")
        failures: list[BaseException] = []
        thread = threading.Thread(target=_serve, args=(fan, stop_r, on_open, failures), daemon=True)
        thread.start()
        try:
            yield
        finally:
            os.write(stop_w, b"x")
            thread.join(30)
        if failures:
            raise failures[0]
    finally:
        for fd in (fan, stop_r, stop_w):
            os.close(fd)  # closing the group lets any open still waiting go on


def _serve(fan: int, stop: int, on_open: OnOpen, failures: list[BaseException]) -> None:
    while fan in select.select([fan, stop], [], [])[0]:
        data = os.read(fan, 4096)
        offset = 0
        while offset < len(data):
            length, _, _, _, _, fd, pid = _EVENT.unpack_from(data, offset)
            offset += length
            try:
                on_open(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), pid)
            except BaseException as exc:  # reported when the hook ends; the open still goes on
                failures.append(exc)
            finally:
                os.write(fan, _RESPONSE.pack(fd, _FAN_ALLOW))
                os.close(fd)
