"""Custom operator plugins: `librkcst_*.so` files that each export `get_rknn_custom_op()`.

As in the original server, every plugin in the plugin directory is loaded once at start and its
operator is registered with each new context. Unlike it, only regular files owned by root or by this
process's user and not writable by others are loaded (loading runs the plugin's code inside the
daemon), and a plugin that fails is logged and skipped instead of stopping the server.
"""

from __future__ import annotations

import ctypes
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


def _refusal(path: Path) -> str:
    """Why `path` must not be loaded, or "" when it may be."""
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid not in (0, os.geteuid()):
        return f"owned by uid {info.st_uid}, neither root nor the daemon's user"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    return ""


def _load(path: Path) -> Plugin:
    handle = ctypes.CDLL(str(path), mode=os.RTLD_NOW)
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
        candidates = sorted(plugin_dir.iterdir())
    except OSError as exc:
        log.warning("Can not access plugin directory: %s (%s)", plugin_dir, exc)
        return ()
    plugins = []
    for path in candidates:
        if not (path.name.startswith(PLUGIN_PREFIX) and path.name.endswith(PLUGIN_SUFFIX)):
            continue
        refusal = _refusal(path)
        if refusal:
            log.warning("skipping plugin %s: %s", path, refusal)
            continue
        try:
            plugins.append(_load(path))
        except (OSError, AttributeError) as exc:
            log.warning("skipping plugin %s: %s", path, exc)
            continue
        log.info("loaded plugin %s", path)
    return tuple(plugins)
