"""Custom-operator plugins: `librkcst_*.so` files that each export `get_rknn_custom_op()`.

Like the original server, every plugin in the plugin directory is opened once at start and its operator
is registered with each new context. Unlike it, a plugin that cannot be trusted or loaded is logged and
skipped instead of stopping the server: only regular files owned by root or by us and not writable by
everyone are opened, since loading one runs its code inside the daemon.
"""

from __future__ import annotations

import ctypes
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .library import RuntimeLibrary

log = logging.getLogger(__name__)

PLUGIN_PREFIX = "librkcst_"
DEFAULT_PLUGIN_DIR = Path("/usr/lib/rknpu/op_plugins")  # Linux; Android uses /vendor/lib64 or /vendor/lib


@dataclass(frozen=True)
class Plugin:
    path: Path
    handle: Any  # the ctypes.CDLL, kept so the library stays loaded
    op: int  # address of its rknn_custom_op


def _untrusted_reason(path: Path) -> str | None:
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid not in (0, os.getuid()):
        return f"owned by uid {info.st_uid}, not root or the daemon's user"
    if info.st_mode & stat.S_IWOTH:
        return "writable by everyone"
    return None


def load_plugins(plugin_dir: Path) -> list[Plugin]:
    """Open every trusted plugin in plugin_dir; problems are logged, never raised."""
    try:
        candidates = sorted(plugin_dir.iterdir())
    except OSError as exc:
        log.info("no custom-op plugins: cannot access plugin directory %s: %s", plugin_dir, exc)
        return []
    plugins = []
    for path in candidates:
        if not (path.name.startswith(PLUGIN_PREFIX) and path.name.endswith(".so")):
            continue
        reason = _untrusted_reason(path)
        if reason:
            log.warning("skipping plugin %s: %s", path, reason)
            continue
        try:
            handle = ctypes.CDLL(str(path))
            factory = handle.get_rknn_custom_op
        except (OSError, AttributeError) as exc:
            log.warning("skipping plugin %s: %s", path, exc)
            continue
        factory.restype = ctypes.c_void_p
        factory.argtypes = []
        op = factory()
        if not op:
            log.warning("skipping plugin %s: get_rknn_custom_op returned NULL", path)
            continue
        log.info("loaded custom-op plugin %s", path)
        plugins.append(Plugin(path, handle, int(op)))
    return plugins


def register_plugins(library: RuntimeLibrary, ctx: Any, plugins: list[Plugin]) -> None:
    """Register each plugin's operator with a new context; one that is refused is logged and skipped."""
    if plugins and not library.has("rknn_register_custom_ops"):
        log.warning("%s cannot register custom operators; plugins ignored", library.path.name)
        return
    for plugin in plugins:
        ret = library.raw("rknn_register_custom_ops", ctx, plugin.op, 1)
        if ret < 0:
            log.warning("rknn_register_custom_ops failed for %s: %d", plugin.path, ret)
