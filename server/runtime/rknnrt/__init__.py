"""The board backend: librknnrt / librknnmrt through ctypes (see backend.RknnrtBackend)."""

from rknn_server.runtime.rknnrt.backend import RknnrtBackend
from rknn_server.runtime.rknnrt.library import find_runtime_library

__all__ = ["RknnrtBackend", "find_runtime_library"]
