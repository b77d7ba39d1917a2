"""Shared-memory tensors when the daemon runs on this host: frames move through /dev/shm, not the wire.

`Session.run` calls `run_frame` first; it answers None whenever shared memory cannot serve the
frame, and the frame then travels over the wire as before. Shared memory is used when all of these
hold, checked once per Device: it is not turned off (RKNN_SHM=off), the daemon's GetInfo says this
caller may (`--shm on`, a loopback TCP caller whose user the kernel names), the daemon's kernel boot
id is this machine's (a daemon behind a tunnel or in a VM has another), and the daemon opened the
very file this process made (same device and inode: the same /dev/shm, not a look-alike).

Each session gets one region, a 0600 file in /dev/shm sized for its inputs and outputs, registered
for that session (the daemon closes it when the session goes) and unlinked right after registering:
the daemon holds it open and this process keeps it mapped, so no other process can open it by name
and nothing is left in /dev/shm if either side dies. Inputs are copied into the mapping and outputs
copied out of it (the region is reused by the next frame); the daemon reads and writes it with
pread/pwrite. A model with a dynamic output size keeps to the wire (its outputs' room is unknown).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rknn_client.errors import NotFound, RknnError, SessionLost
from rknn_proto import codec, rknn_pb2

if TYPE_CHECKING:
    from rknn_client.api import Device, Session

ENV = "RKNN_SHM"
SHM_DIR = Path("/dev/shm")
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
ALIGN = 64
MIN_REGION_BYTES = 1 << 20
_OUTPUT_LIMITS = codec.TensorLimits(max_tensor_bytes=16 << 30, max_rank=32, max_tensors=4096)
log = logging.getLogger("rknn_client.shared_memory")


def enabled_by_env() -> bool:
    """On unless RKNN_SHM says off/0/false/no."""
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def local_boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class Region:
    """A file in /dev/shm made by this process, mapped here, registered on the daemon under `key`."""

    def __init__(self, size: int) -> None:
        self.key = "r-" + secrets.token_hex(8)
        self.name = f"rknn-client-{os.getpid()}-{secrets.token_hex(8)}"
        self.size = size
        self.path = SHM_DIR / self.name
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
            self.stat = os.fstat(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)  # the mapping keeps the file
        self._finalizer = weakref.finalize(self, _discard, self.map, self.path)

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self._finalizer()


def _discard(region_map: mmap.mmap, path: Path) -> None:
    path.unlink(missing_ok=True)
    with contextlib.suppress(BufferError):  # an array still views it: the mapping goes with that array
        region_map.close()


@dataclass
class _Bound:
    """A session's region and the session id it was registered for."""

    session_id: str
    region: Region


_DEVICES: weakref.WeakKeyDictionary[Device, bool] = weakref.WeakKeyDictionary()
_SESSIONS: weakref.WeakKeyDictionary[Session, _Bound] = weakref.WeakKeyDictionary()


def usable(device: Device) -> bool:
    """Whether frames to this device may go through shared memory (asked once per Device)."""
    known = _DEVICES.get(device)
    if known is None:
        known = False
        if enabled_by_env() and SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK):
            try:
                info = device.handshake().shared_memory
            except RknnError:
                info = rknn_pb2.SharedMemoryInfo()
            known = info.allowed and bool(info.boot_id) and info.boot_id == local_boot_id()
            if not known:
                log.debug("shared memory not used with %s: %s", device.endpoint.description, info.reason)
        _DEVICES[device] = known
    return known


def disable(device: Device) -> None:
    """Keep this device's frames on the wire from now on (e.g. RKNN_SHM was not enough: tests)."""
    _DEVICES[device] = False


def _output_room(session: Session) -> list[int] | None:
    """Each output's slot size: its static size, as float32 at least (a dequantized output's size)."""
    if any(s.is_dynamic for s in session.outputs):
        return None
    return [int(np.prod(s.shape)) * max(s.dtype.itemsize, 4) for s in session.outputs]


def _region(session: Session, size: int) -> Region | None:
    """The session's registered region, at least `size` bytes (made or grown here)."""
    bound = _SESSIONS.get(session)
    if bound is not None and bound.session_id == session.id and bound.region.size >= size:
        return bound.region
    if bound is not None:
        _SESSIONS.pop(session, None)
        _unregister(session.device, bound)
    region = Region(max(MIN_REGION_BYTES, _aligned(size + size // 4)))
    try:
        reply = session.device._call(
            "RegisterSharedMemory",
            session.device._stub.RegisterSharedMemory,
            rknn_pb2.RegisterSharedMemoryRequest(
                key=region.key, name=region.name, size=region.size, session_id=session.id
            ),
        )
    except SessionLost:
        region.close()
        raise
    except RknnError as exc:
        region.close()
        log.debug("shared memory registration refused, using the wire: %s", exc)
        disable(session.device)
        return None
    finally:
        region.unlink()
    if (reply.device, reply.inode) != (region.stat.st_dev, region.stat.st_ino):
        _unregister(session.device, _Bound(session.id, region))  # the daemon sees another /dev/shm
        disable(session.device)
        return None
    _SESSIONS[session] = _Bound(session.id, region)
    return region


def _unregister(device: Device, bound: _Bound) -> None:
    with contextlib.suppress(RknnError):  # gone with its session already
        device._call(
            "UnregisterSharedMemory",
            device._stub.UnregisterSharedMemory,
            rknn_pb2.UnregisterSharedMemoryRequest(key=bound.region.key),
        )
    bound.region.close()


def _slots(sizes: Sequence[int], start: int, key: str) -> list[rknn_pb2.TensorRegion]:
    slots, offset = [], start
    for size in sizes:
        slots.append(rknn_pb2.TensorRegion(key=key, offset=offset, byte_length=size))
        offset += _aligned(size)
    return slots


def run_frame(
    session: Session, header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray]
) -> list[np.ndarray] | None:
    """The frame's outputs through shared memory, or None when it must go over the wire."""
    device = session.device
    room = _output_room(session)
    if room is None or not usable(device):
        return None
    inputs_size = sum(_aligned(a.nbytes) for a in wire)
    region = _region(session, inputs_size + sum(_aligned(r) for r in room))
    if region is None:
        return None
    input_slots = _slots([a.nbytes for a in wire], 0, region.key)
    output_slots = _slots(room, inputs_size, region.key)
    for array, slot in zip(wire, input_slots, strict=True):
        np.ndarray(array.shape, array.dtype, region.map, slot.offset)[...] = array
    shared = rknn_pb2.InferenceHeader()
    shared.CopyFrom(header)
    shared.input_regions.extend(input_slots)
    shared.output_regions.extend(output_slots)
    try:
        reply = device._call("RunShared", device._stub.RunShared, rknn_pb2.RunRequest(header=shared))
    except SessionLost:
        raise
    except NotFound:  # the region is gone (unregistered, reaped): the next frame registers another
        bound = _SESSIONS.pop(session, None)
        if bound is not None:
            bound.region.close()
        return None
    session.last_run_time_us = reply.header.run_time_us
    metas = reply.header.outputs
    layouts = codec.check_metas(metas, _OUTPUT_LIMITS, "output")
    outputs = []
    for (dtype, shape), meta, slot in zip(layouts, metas, output_slots, strict=True):
        if meta.byte_length > slot.byte_length:
            raise RknnError(f"the daemon wrote {meta.byte_length} bytes into a slot of {slot.byte_length}")
        outputs.append(np.ndarray(shape, dtype, region.map, slot.offset).copy())
    return session.real_outputs(outputs)


__all__ = ["ENV", "disable", "enabled_by_env", "run_frame", "usable"]
