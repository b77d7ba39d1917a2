"""The board backend: librknnrt.so / librknnmrt.so through ctypes (see backend.RknnrtBackend)."""
