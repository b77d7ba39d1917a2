"""Triton's system shared-memory extension over the daemon's own shared-memory registry (server/core/shm.py).

A v2 client registers a region by a name of its choosing, the POSIX shared-memory object's key
(`/name`, a file of the shared-memory folder), an offset into it and a byte size; inputs and outputs
then name the region with an offset and byte size of their own. Everything the project's regions
promise holds here because they are the registry's regions: only a loopback caller whose user the
kernel names, a regular file that user owns, opened without following links, read and written by
descriptor (a truncated file gives a short read, never SIGBUS), the per-client count and byte caps,
and a region unused for the session idle timeout is closed. A v2 region's registry key is its name
under the `v2.` prefix, so v2 status and unregister-all never reach the owner's rknn.v1 regions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rknn_server.core.shm import Region, SharedMemoryRegistry
from rknn_server.errors import InvalidInput, NotFound

PREFIX = "v2."
MAX_NAME = 64 - len(PREFIX)  # the registry's keys are at most 64 characters


@dataclass(frozen=True)
class RegionSlot:
    """Where a tensor's bytes are: a registered region's name, an offset into it, a byte count."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class _Window:
    key: str  # the client's object key, as registered
    offset: int
    byte_size: int


class SystemRegions:
    """Each v2 client's registered regions: the registry's open files, with Triton's window on each."""

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry = registry
        self._windows: dict[tuple[str, str], _Window] = {}

    def register(self, owner: str, peer: str, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open `key` (a shared-memory object of the caller's) as the region `name`: [offset, offset +
        byte_size) must lie inside the file as it is now."""
        if not 0 < len(name) <= MAX_NAME:
            raise InvalidInput(f"region name {name[:80]!r} must be 1 to {MAX_NAME} characters")
        uid = self.registry.admit(peer)
        live = {r.key for r in self.registry.mine(owner)}  # the reaper closes regions unused for long
        for gone in [k for k in self._windows if k[0] == owner and PREFIX + k[1] not in live]:
            del self._windows[gone]
        region = self.registry.register(owner, uid, PREFIX + name, key.removeprefix("/"), 0, "")
        if offset + byte_size > region.size or byte_size == 0:
            self.registry.unregister(owner, region.key)
            raise InvalidInput(
                f"region {name!r}: offset {offset} and byte_size {byte_size} do not fit the {region.size}-byte "
                f"object {key[:80]!r} (byte_size must be 1 or more)"
            )
        self._windows[(owner, name)] = _Window(key, offset, byte_size)

    def status(self, owner: str, name: str = "") -> list[RegionStatus]:
        """The owner's regions (or the one named: NOT_FOUND if it is not registered)."""
        if name:
            self._region(owner, name)
        found = []
        for region in self.registry.mine(owner):
            if region.key.startswith(PREFIX) and name in ("", region.key[len(PREFIX) :]):
                window = self._windows.get((owner, region.key[len(PREFIX) :]))
                if window is not None:
                    found.append(
                        RegionStatus(region.key[len(PREFIX) :], window.key, window.offset, window.byte_size)
                    )
        return found

    def unregister(self, owner: str, name: str = "") -> None:
        """The region `name`, or every v2 region of the owner's when `name` is empty (Triton's rule)."""
        names = [name] if name else [r.name for r in self.status(owner)]
        for each in names:
            self._region(owner, each)
            self.registry.unregister(owner, PREFIX + each)
            self._windows.pop((owner, each), None)

    def _region(self, owner: str, name: str) -> tuple[Region, _Window]:
        window = self._windows.get((owner, name))
        try:
            region = self.registry.get(owner, PREFIX + name)
        except NotFound:
            self._windows.pop((owner, name), None)  # closed by the idle reaper
            window = None
        if window is None:
            raise NotFound(f"no system shared-memory region {name[:80]!r} is registered by this client")
        return region, window

    def slot(self, owner: str, slot: RegionSlot, what: str) -> tuple[Region, int]:
        """The region holding `slot` and the slot's offset in its file; the slot must lie in the window."""
        region, window = self._region(owner, slot.region)
        if slot.offset < 0 or slot.byte_size < 0 or slot.offset + slot.byte_size > window.byte_size:
            raise InvalidInput(
                f"{what}: shared_memory_offset {slot.offset} and shared_memory_byte_size {slot.byte_size} "
                f"lie outside region {slot.region!r} of {window.byte_size} bytes"
            )
        return region, window.offset + slot.offset

    def read(self, region: Region, offset: int, byte_size: int, what: str) -> np.ndarray:
        """A slot's bytes, copied out by descriptor (blocking: run it in the executor)."""
        buffer = np.empty(byte_size, np.uint8)
        region.read_into(buffer, offset, what)
        return buffer

    @contextlib.contextmanager
    def in_use(self, region: Region) -> Iterator[Region]:
        """The region counted in use while a call reads or writes it (the registry closes it only after)."""
        self.registry.acquire([region])
        try:
            yield region
        finally:
            self.registry.release([region])


def parse_slot(parameters: dict[str, object], what: str) -> RegionSlot | None:
    """A tensor's `shared_memory_region`, `shared_memory_byte_size` and `shared_memory_offset`
    parameters (None when it names no region)."""
    region = parameters.get("shared_memory_region")
    if region is None:
        return None
    size, offset = parameters.get("shared_memory_byte_size"), parameters.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not isinstance(size, int) or not isinstance(offset, int):
        raise InvalidInput(
            f"{what}: shared_memory_region (a string) needs shared_memory_byte_size (an integer) and takes "
            "shared_memory_offset (an integer)"
        )
    return RegionSlot(region, offset, size)


__all__ = ["RegionSlot", "RegionStatus", "SystemRegions", "parse_slot"]
