"""Choose the runtime backend for `--runtime auto|host|rknnrt`, and say why."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from rknn_server.board.platform import PlatformInfo
from rknn_server.runtime.base import Backend, BackendError

HOST_FALLBACK = "serving the host runtime (ONNX Runtime on the CPU)"
# The host extra, which the host runtime's models import (host_model.py): the backend starts without them.
HOST_MODULES = ("onnx", "onnxruntime", "psutil")


class BackendUnavailable(Exception):
    """The requested backend cannot run here; the message says what is missing."""


def host_backend(
    soc: str, threads: int | None, sysfs_root: Path = Path("/"), models_in_cache: bool = False
) -> Backend:
    try:
        from rknn_server.runtime.host import HostBackend

        for name in HOST_MODULES:
            if importlib.util.find_spec(name) is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    except ImportError as exc:
        # No PyPI command here: the project is installed from its wheel (docs/deploy.md), and a board's
        # install rarely wants ONNX Runtime (none exists for armv7l).
        raise BackendUnavailable(
            f"the host runtime (ONNX Runtime on the CPU) needs the project's host extra, which this install "
            f"lacks ({exc}); reinstall the project's wheel with it: pip install 'WHEEL[host]' (docs/deploy.md)"
        ) from exc
    return HostBackend(soc=soc, threads=threads, sysfs_root=sysfs_root, remember_facts=models_in_cache)


def _npu_node(probe: PlatformInfo) -> str:
    if probe.npu_device:
        return f"NPU device {probe.npu_device}"
    return f"no NPU device node (/dev/dri/renderD*, /dev/rknpu) under {probe.root}"


def _library_path(probe: PlatformInfo, runtime_lib: Path | None) -> Path:
    from rknn_server.runtime.rknnrt.library import LIBRARY_DIRS, LIBRARY_NAMES, find_runtime_library

    found = find_runtime_library(probe.root, runtime_lib)
    if found is not None:
        return found
    if runtime_lib is not None:
        raise BackendUnavailable(f"the RKNN runtime library {runtime_lib} (--runtime-lib) does not exist")
    places = ", ".join(str(probe.root / d) for d in LIBRARY_DIRS)
    raise BackendUnavailable(f"no RKNN runtime library ({' or '.join(LIBRARY_NAMES)}) in {places}")


def _rknnrt(probe: PlatformInfo, library: Path, plugin_dir: Path | None) -> Backend:
    from rknn_server.runtime.rknnrt.backend import RknnrtBackend

    try:
        return RknnrtBackend(library, probe, plugin_dir)
    except BackendError as exc:
        raise BackendUnavailable(str(exc)) from exc


def _auto_rknnrt(
    probe: PlatformInfo, runtime_lib: Path | None, plugin_dir: Path | None
) -> tuple[Backend, Path]:
    """The rknnrt backend and its library when both the library and an NPU node are here; else
    BackendUnavailable naming what is missing, with what was seen of the other."""
    try:
        library = _library_path(probe, runtime_lib)
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"{exc}; {_npu_node(probe)}") from exc
    if not probe.npu_device:
        raise BackendUnavailable(f"{library} is present but {_npu_node(probe)}")
    return _rknnrt(probe, library, plugin_dir), library


def select_backend(
    requested: str,
    soc: str,
    threads: int | None,
    *,
    probe: PlatformInfo | None = None,
    runtime_lib: Path | None = None,
    plugin_dir: Path | None = None,
    models_in_cache: bool = False,
) -> tuple[Backend, str]:
    """The backend to serve with and a sentence on why it was chosen.

    `auto` picks rknnrt when the runtime library loads and the board has an NPU device node, else
    host. A declared `soc` (--soc) takes the place of the probed one. `models_in_cache`: the daemon's
    backend, which opens only files of its model cache, and may keep beside them what it learns.
    """
    probe = probe or PlatformInfo()
    if soc:
        probe = dataclasses.replace(probe, soc=soc)
    if requested == "host":
        host = host_backend(probe.soc, threads, probe.root, models_in_cache)
        return host, "host runtime requested (--runtime host)"
    if requested == "rknnrt":
        library = _library_path(probe, runtime_lib)
        reason = f"rknnrt runtime requested (--runtime rknnrt): {library}; {_npu_node(probe)}"
        return _rknnrt(probe, library, plugin_dir), reason
    if requested == "auto":
        try:
            backend, library = _auto_rknnrt(probe, runtime_lib, plugin_dir)
        except BackendUnavailable as rknnrt_cause:
            try:
                host = host_backend(probe.soc, threads, probe.root, models_in_cache)
                return host, f"{rknnrt_cause}; {HOST_FALLBACK}"
            except BackendUnavailable as host_cause:
                raise BackendUnavailable(
                    f"neither runtime can start (--runtime auto): rknnrt: {rknnrt_cause}; host: {host_cause}"
                ) from host_cause
        return backend, f"{library} loaded and NPU device {probe.npu_device} found"
    raise BackendUnavailable(f"unknown runtime {requested!r}; expected auto, host or rknnrt")
