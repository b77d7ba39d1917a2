"""Custom operator plugins: `librkcst_*.so` files that each export `get_rknn_custom_op()`.

As in the original server, every plugin in the plugin directory is loaded once at start and its
operator is registered with each new context. Unlike it, loading runs the plugin's code inside the
daemon, so a plugin is loaded only when the directory and the file are owned by root or by this
process's user and writable by nobody else (no group or other write bit), and the file is a regular
file reached without a link. The file is opened once and loaded from that descriptor
(`/proc/self/fd/N`): what was checked is what runs, even if the path is replaced in between. A
refused or failing plugin is logged with the reason and skipped instead of stopping the server.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PLUGIN_PREFIX = "librkcst_"
PLUGIN_SUFFIX = ".so"
DEFAULT_PLUGIN_DIR = Path("/usr/lib/rknpu/op_plugins")  # Linux; Android keeps them in /vendor/lib64
ENTRY_POINT = "get_rknn_custom_op"


@dataclass(frozen=True)
class Plugin:
    path: Path
    handle: ctypes.CDLL  # kept so the library stays loaded while its op is registered
    op: int  # address of the plugin's rknn_custom_op


class Refused(Exception):
    """Why a plugin (or its directory) must not be loaded."""


def _check_owner_and_mode(info: os.stat_result, what: str) -> None:
    if info.st_uid not in (0, os.geteuid()):
        raise Refused(f"{what} is owned by uid {info.st_uid}, neither root nor the daemon's user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        writable = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
        raise Refused(f"{what} is writable by {writable} (mode {stat.S_IMODE(info.st_mode):o})")


def _open_checked(dir_fd: int, name: str) -> int:
    """A read-only descriptor of the plugin `name` in the directory `dir_fd`, once it passes the checks."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("it is a symbolic link") from exc
        raise Refused(f"it cannot be opened ({exc.strerror})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("it is not a regular file")
        _check_owner_and_mode(info, "the file")
    except BaseException:
        os.close(fd)
        raise
    return fd


# Descriptors of the libraries loaded here, never closed. The dynamic loader knows a loaded library by
# the name it was opened with, and ctypes never unloads one: were /proc/self/fd/N closed and N reused,
# a later plugin opened as /proc/self/fd/N would silently get the earlier library.
_PINNED: list[int] = []


def _load(path: Path, fd: int) -> Plugin:
    """Load the checked file through its descriptor (whatever the path names by now)."""
    handle = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_NOW)
    _PINNED.append(fd)
    entry = getattr(handle, ENTRY_POINT)
    entry.restype = ctypes.c_void_p
    entry.argtypes = ()
    op = entry()
    if not op:
        raise OSError(f"{ENTRY_POINT}() returned NULL")
    return Plugin(path=path, handle=handle, op=int(op))


def load_plugins(plugin_dir: Path) -> tuple[Plugin, ...]:
    """Every loadable plugin in `plugin_dir`, in name order."""
    try:
        dir_fd = os.open(plugin_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("Can not access plugin directory: %s (%s)", plugin_dir, exc)
        return ()
    try:
        _check_owner_and_mode(os.fstat(dir_fd), "the plugin directory")
        names = sorted(os.listdir(dir_fd))
    except (Refused, OSError) as exc:
        log.warning("skipping every plugin in %s: %s", plugin_dir, exc)
        os.close(dir_fd)
        return ()
    plugins = []
    try:
        for name in names:
            if name.startswith(PLUGIN_PREFIX) and name.endswith(PLUGIN_SUFFIX):
                plugin = _load_one(dir_fd, plugin_dir / name)
                if plugin is not None:
                    plugins.append(plugin)
    finally:
        os.close(dir_fd)
    return tuple(plugins)


def _load_one(dir_fd: int, path: Path) -> Plugin | None:
    try:
        fd = _open_checked(dir_fd, path.name)
    except Refused as exc:
        log.warning("skipping plugin %s: %s", path, exc)
        return None
    try:
        plugin = _load(path, fd)
    except (OSError, AttributeError) as exc:
        log.warning("skipping plugin %s: %s", path, exc)
        return None
    finally:
        if fd not in _PINNED:
            os.close(fd)
    log.info("loaded plugin %s", path)
    return plugin
