"""Choose the runtime backend for `--runtime auto|host|rknnrt`, and say why."""

from __future__ import annotations

from rknn_server.runtime.base import Backend


class BackendUnavailable(Exception):
    """The requested backend cannot run here; the message says what is missing."""


def host_backend(soc: str, threads: int | None) -> Backend:
    try:
        from rknn_server.runtime.host import HostBackend
    except ImportError as exc:
        raise BackendUnavailable(
            f"the host runtime needs ONNX Runtime, which is not installed ({exc}); "
            "install it with: pip install 'rknn-server-oss[host]'"
        ) from exc
    return HostBackend(soc=soc, threads=threads)


def select_backend(requested: str, soc: str, threads: int | None) -> tuple[Backend, str]:
    """The backend to serve with and a sentence on why it was chosen."""
    if requested == "host":
        return host_backend(soc, threads), "host runtime requested (--runtime host)"
    if requested in ("auto", "rknnrt"):
        if requested == "rknnrt":
            raise BackendUnavailable("the rknnrt runtime is not part of this build yet; use --runtime host")
        backend = host_backend(soc, threads)
        return backend, "no RKNN runtime library found; serving the host runtime (ONNX Runtime on the CPU)"
    raise BackendUnavailable(f"unknown runtime {requested!r}; expected auto, host or rknnrt")
