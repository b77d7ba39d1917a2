"""The board backend: librknnrt / librknnmrt through ctypes (see backend.RknnrtBackend).

Nothing is imported here: the legacy protocol uses abi's and tensors' types, and a daemon serving the
host runtime should not load the backend (its model, plugins and perf parser) for them.
"""
