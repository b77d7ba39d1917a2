"""Shared-memory tensors when the daemon runs on this host: frames move through /dev/shm, not the wire.

A session's SharedMemoryRoute (client/routes.py) calls `run_frame` first; it answers None whenever
shared memory cannot serve the frame, and the frame then travels over the wire as before. Shared memory
is used when all of these hold, checked once per Device: it is not turned off (RKNN_SHM=off; =file
keeps to /dev/shm files), the daemon's GetInfo says this caller may (`--shm on`, a loopback TCP
caller whose user the kernel names), the daemon's kernel boot id is this machine's (a daemon behind a
tunnel or in a VM has another), and the daemon opened the very file this process made (same device
and inode: the same /dev/shm, not a look-alike).

Each session gets one region sized for its inputs and outputs, registered for that session (the
daemon closes it when the session goes). First choice: a memfd sealed against shrinking, which the
daemon reopens through /proc/<pid>/fd (same PID namespace) and maps, reading inputs in place. Else
(another PID namespace, RKNN_SHM=file): a 0600 file in /dev/shm, which the daemon reads and writes
with pread/pwrite, unlinked right after registering so that no other process can open it by name and
nothing is left in /dev/shm if either side dies. Inputs are copied into this process's mapping once and
outputs copied out of it (the region is reused by the next frame), or lent as views of it to a
caller that asks (`lend_outputs`). A model with a dynamic output
size keeps to the wire (its outputs' room is unknown).

Each frame is rung on the session's doorbell (client/local/doorbell.py: one unix-socket message each way,
no gRPC call) where the daemon offers one, else sent as one RunShared call (`use_doorbell`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import mmap
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rknn_client.errors import InvalidInput, NotFound, ResourceExhausted, RknnError, SessionLost
from rknn_client.local.doorbell import Doorbell, DoorbellLost
from rknn_proto import codec, rknn_pb2
from rknn_proto.buffers import MIN_POOLED_BYTES, BufferPool
from rknn_proto.messages import TensorAttr
from rknn_proto.reasons import Reason

if TYPE_CHECKING:
    from rknn_client.device import Device
    from rknn_client.session import Session

ENV = "RKNN_SHM"
SHM_DIR = Path("/dev/shm")
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
ALIGN = 64
MIN_REGION_BYTES = 1 << 20
DOORBELL_RETRY_S = 5.0
ROOMS_KEPT = 8  # the input shapes whose outputs' sizes a session remembers (learn_room)
_OUTPUT_LIMITS = codec.TensorLimits(max_tensor_bytes=16 << 30, max_rank=32, max_tensors=4096)
log = logging.getLogger("rknn_client.local.shared_memory")


def enabled_by_env() -> bool:
    """On unless RKNN_SHM says off/0/false/no."""
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def _memfd_allowed() -> bool:
    """RKNN_SHM=file keeps to /dev/shm files (e.g. to test a shared folder); memfd needs Linux."""
    return hasattr(os, "memfd_create") and os.environ.get(ENV, "on").strip().lower() != "file"


def local_boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class Region:
    """Memory shared with the daemon, mapped here, registered on the daemon under `key`: a memfd
    sealed against shrinking (`memfd=True`, which the daemon maps) or a file in /dev/shm."""

    def __init__(self, size: int, memfd: bool) -> None:
        self.key = "r-" + secrets.token_hex(8)
        self.name = f"rknn-client-{os.getpid()}-{secrets.token_hex(8)}"
        self.size = size
        self.path: Path | None = None if memfd else SHM_DIR / self.name
        if self.path is None:
            fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        else:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            if self.path is None:
                fcntl.fcntl(
                    fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
                )
            self.map = mmap.mmap(fd, size)
            self.stat = os.fstat(fd)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        # A memfd's descriptor stays open until the daemon has reopened it; a file's mapping keeps it.
        self.fd = fd if self.path is None else -1
        if self.path is not None:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _discard, self.map, self.path)

    def request(self, session_id: str) -> rknn_pb2.RegisterSharedMemoryRequest:
        if self.path is None:
            return rknn_pb2.RegisterSharedMemoryRequest(
                key=self.key,
                name=self.name,  # a label only: the memfd's own name
                size=self.size,
                session_id=session_id,
                memfd=True,
                pid=os.getpid(),
                fd=self.fd,
            )
        return rknn_pb2.RegisterSharedMemoryRequest(
            key=self.key, name=self.name, size=self.size, session_id=session_id
        )

    def unlink(self) -> None:
        """Registered (or refused): no other process needs to find it any more."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        elif self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        self.unlink()
        self._finalizer()


def _discard(region_map: mmap.mmap, path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
    with contextlib.suppress(BufferError):  # an array still views it: the mapping goes with that array
        region_map.close()


@dataclass(eq=False)
class _Bound:
    """A session's region, the session id it was registered for and its outputs' room; the last
    frame's header with its slots (made again only when a frame's header differs) and arrays over
    its input slots, and the doorbell ringing that header."""

    session_id: str
    region: Region
    room: list[int]
    key: bytes = b""  # the last frame's header as run() made it, less its frame id
    source: rknn_pb2.InferenceHeader | None = None  # ... the very header object run() gave
    header: rknn_pb2.InferenceHeader | None = None  # ... with its slots in the region
    slots: list[np.ndarray] = field(default_factory=list)  # ... arrays over its input slots
    doorbell: Doorbell | None = None
    plan: bytes = b""  # the key of the header the doorbell was opened for
    retry_at: float = 0.0  # a doorbell that could not be had is asked for again after this
    # The last frame's output metas as the daemon answered them, and arrays over their slots.
    answered: Sequence[rknn_pb2.TensorMeta] | None = None
    outputs: list[np.ndarray] = field(default_factory=list)

    def frame_header(
        self, header: rknn_pb2.InferenceHeader, wire: Sequence[np.ndarray]
    ) -> rknn_pb2.InferenceHeader:
        """The frame's header with a slot for each input and output: the inputs from the region's
        start, then the outputs' room. The header run() gave last time (Session._frame keeps it
        while frames stay alike) has them already."""
        if header is self.source and self.header is not None:
            return self.header
        frame_id, header.frame_id = header.frame_id, 0
        key = header.SerializeToString()
        header.frame_id = frame_id
        if self.header is None or key != self.key:
            sizes = [a.nbytes for a in wire]
            shared = rknn_pb2.InferenceHeader()
            shared.CopyFrom(header)
            shared.input_regions.extend(_slots(sizes, 0, self.region.key))
            shared.output_regions.extend(_slots(self.room, sum(_aligned(n) for n in sizes), self.region.key))
            self.input_slots(wire)
            self.key, self.header = key, shared
            self.answered = None  # the output slots may have moved: arrays over them made again
        self.source = header
        self.header.frame_id = frame_id
        return self.header

    def input_slots(self, like: Sequence[np.ndarray | TensorAttr]) -> list[np.ndarray]:
        """Arrays over the input slots, in the shapes and dtypes of `like` (the same arrays as long as
        those stay: input_buffers hands them out, and a frame of them copies nothing)."""
        if [(v.shape, v.dtype) for v in self.slots] != [(tuple(a.shape), a.dtype) for a in like]:
            sizes = [math.prod(a.shape) * a.dtype.itemsize for a in like]
            self.slots = [
                np.ndarray(tuple(a.shape), a.dtype, self.region.map, slot.offset)
                for a, slot in zip(like, _slots(sizes, 0, self.region.key), strict=True)
            ]
        return self.slots

    def output_arrays(self, metas: Sequence[rknn_pb2.TensorMeta]) -> list[np.ndarray]:
        """Read-only arrays over the output slots, as the daemon's metas describe the outputs (checked
        once for frames whose metas are the last frame's)."""
        if self.answered is None or self.answered != metas:
            layouts = codec.check_metas(metas, _OUTPUT_LIMITS, "output")
            arrays = []
            assert self.header is not None
            for (dtype, shape), meta, slot in zip(layouts, metas, self.header.output_regions, strict=True):
                if meta.byte_length > slot.byte_length:
                    raise RknnError(
                        f"the daemon wrote {meta.byte_length} bytes into a slot of {slot.byte_length}"
                    )
                view = np.ndarray(shape, dtype, self.region.map, slot.offset)
                view.flags.writeable = False
                arrays.append(view)
            self.answered, self.outputs = metas, arrays
        return self.outputs

    def hang_up(self) -> None:
        if self.doorbell is not None:
            self.doorbell.close()
            self.doorbell = None


@dataclass
class DeviceState:
    """What shared memory knows of one Device (its `shm`), learnt on its first frame."""

    usable: bool | None = None  # None: not asked yet (see usable)
    doorbells: bool = False  # the daemon offers doorbells, and they work
    memfd: bool | None = None  # which kind of region the daemon took: a memfd (True) or a file
    bound: weakref.WeakSet[_Bound] = field(default_factory=weakref.WeakSet)  # its sessions' regions


@dataclass
class SessionState:
    """One Session's shared memory (its `shm`): frames of several threads take turns on `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    bound: _Bound | None = None
    lent: bool = False  # outputs handed out as views of the region, not copies (lend_outputs)
    # The memory of large outputs copied out of the region, used again once the caller drops them.
    buffers: BufferPool = field(default_factory=BufferPool)
    # Output slot sizes learnt over the wire, by the inputs' shapes and dtypes (learn_room).
    rooms: dict[tuple[tuple[tuple[int, ...], str], ...], list[int]] = field(default_factory=dict)


def usable(device: Device) -> bool:
    """Whether frames to this device may go through shared memory (asked once per Device)."""
    state = device.shm
    if state.usable is None:
        known = False
        if enabled_by_env() and SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK):
            try:
                info = device.handshake().shared_memory
            except RknnError:
                info = rknn_pb2.SharedMemoryInfo()
            known = info.allowed and bool(info.boot_id) and info.boot_id == local_boot_id()
            state.doorbells = known and info.doorbell
            if not known:
                log.debug("shared memory not used with %s: %s", device.endpoint.description, info.reason)
        state.usable = known
    return state.usable


def disable(device: Device) -> None:
    """Keep this device's frames on the wire from now on (e.g. RKNN_SHM was not enough: tests)."""
    device.shm.usable = False


def device_closed(device: Device) -> None:
    """Hang up the device's doorbells: closing a Device ends what runs on it (its gRPC calls are
    cancelled; a thread waiting on a doorbell gets DoorbellLost, then the closed channel's error)."""
    device.shm.doorbells = False
    for bound in list(device.shm.bound):
        bound.hang_up()


def use_doorbell(device: Device, use: bool = True) -> None:
    """Ring this device's frames on doorbells (the default where the daemon offers them) or send
    each as a RunShared call (`use=False`: e.g. to measure one against the other)."""
    usable(device)
    device.shm.doorbells = use and device.shm.doorbells


def lend_outputs(session: Session, lend: bool = True) -> None:
    """Hand out this session's shared-memory outputs as read-only views of its region instead of
    copies: no copy at all on this side, but each view holds its values only until the session's
    next frame writes over them (copy what must last). For a caller that uses each frame's outputs
    before running the next; frames over the wire are unaffected (their outputs are always new)."""
    session.shm.lent = lend


def _room(shapes: Sequence[Sequence[int]], itemsizes: Sequence[int]) -> list[int]:
    """Slot sizes for outputs of these shapes, as float32 at least (a dequantized output's size)."""
    return [math.prod(shape) * max(itemsize, 4) for shape, itemsize in zip(shapes, itemsizes, strict=True)]


def _inputs_key(like: Sequence[np.ndarray | TensorAttr]) -> tuple[tuple[tuple[int, ...], str], ...]:
    return tuple((tuple(a.shape), np.dtype(a.dtype).str) for a in like)


def _output_room(session: Session, like: Sequence[np.ndarray | TensorAttr]) -> list[int] | None:
    """Each output's slot size for a frame of inputs like `like`: its static size, else the size a
    frame of such inputs had over the wire (learn_room; most exported models' batch axis is dynamic,
    so their outputs are even once the inputs are fixed), else None: the frame keeps to the wire."""
    if not any(s.is_dynamic for s in session.outputs):
        return _room([s.shape for s in session.outputs], [s.dtype.itemsize for s in session.outputs])
    return session.shm.rooms.get(_inputs_key(like))


def learn_room(session: Session, wire: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
    """Remember the outputs' sizes of a frame that went over the wire, for frames of inputs like its
    (a model of dynamic output shapes; the last few input shapes kept). An output that grows past its
    slot later is refused by the daemon before anything is written, and that frame goes by the wire."""
    if not any(s.is_dynamic for s in session.outputs) or not usable(session.device):
        return
    rooms = session.shm.rooms
    rooms.pop(key := _inputs_key(wire), None)
    rooms[key] = _room([o.shape for o in outputs], [o.dtype.itemsize for o in outputs])
    while len(rooms) > ROOMS_KEPT:
        del rooms[next(iter(rooms))]


def _register(session: Session, size: int, memfd: bool) -> Region | None:
    """A new region registered for the session, or None when the daemon cannot take this kind."""
    region = Region(size, memfd)
    try:
        reply = session.device.register_shared_memory(region.request(session.id))
    except SessionLost:
        region.close()
        raise
    except RknnError as exc:
        region.close()
        log.debug("shared memory (%s) refused: %s", "memfd" if memfd else "/dev/shm file", exc)
        return None
    finally:
        region.unlink()
    if (reply.device, reply.inode) != (region.stat.st_dev, region.stat.st_ino):
        _unregister(session.device, _Bound(session.id, region, []))  # the daemon sees another /dev/shm
        return None
    return region


def _bound(session: Session, input_sizes: Sequence[int], room: list[int]) -> _Bound | None:
    """The session's registered region, with room for these inputs and outputs (made or grown here).
    A sealed memfd (mapped by the daemon: no copies there) is tried first, then a /dev/shm file; the
    kind that worked is kept for the device, and when neither did the device keeps to the wire."""
    size = sum(_aligned(n) for n in input_sizes) + sum(_aligned(r) for r in room)
    bound = session.shm.bound
    if bound is not None and bound.session_id == session.id and bound.region.size >= size:
        if bound.room != room:  # outputs of another size (a dynamic model's other input shape):
            bound.room, bound.header = room, None  # new slots, and a doorbell for them
            bound.hang_up()
        return bound
    if bound is not None:
        session.shm.bound = None
        _unregister(session.device, bound)
    device = session.device
    known = device.shm.memfd
    kinds = [known] if known is not None else [True, False] if _memfd_allowed() else [False]
    for memfd in kinds:
        region = _register(session, max(MIN_REGION_BYTES, _aligned(size + size // 4)), memfd)
        if region is not None:
            device.shm.memfd = memfd
            bound = session.shm.bound = _Bound(session.id, region, room)
            device.shm.bound.add(bound)
            return bound
    disable(device)
    return None


def _unregister(device: Device, bound: _Bound) -> None:
    bound.hang_up()
    with contextlib.suppress(RknnError):  # gone with its session already
        device.unregister_shared_memory(bound.region.key)
    bound.region.close()


def input_buffers(session: Session) -> list[np.ndarray]:
    """Arrays to write a frame's inputs into, one per model input in its own shape and dtype. Where
    the session's frames go through shared memory they are its region's input slots, so
    `session.run` on them copies no input bytes on this side (a camera frame decoded straight into
    them reaches the daemon with no copy at all); elsewhere (the wire) they are plain new arrays, so
    the same code runs either way. They hold what was last written into them; run() reads them as
    they are when it is called, and any other array passed to it is copied in as before."""
    dynamic = next((s for s in session.inputs if s.is_dynamic), None)
    if dynamic is not None:
        raise InvalidInput(
            f"input {dynamic.index} ({dynamic.name}) has a dynamic shape {list(dynamic.shape)}; "
            "input buffers need every input's shape fixed: make the arrays and pass them to run()"
        )
    sizes = [s.size_bytes for s in session.inputs]
    room = _output_room(session, session.inputs)
    bound = None
    if room is not None and usable(session.device):
        with session.shm.lock:
            bound = _bound(session, sizes, room)
    if bound is None:
        return [np.zeros(s.shape, s.dtype) for s in session.inputs]
    return list(bound.input_slots(session.inputs))


def _is_slot(array: np.ndarray, slot: np.ndarray, region: Region) -> bool:
    """Whether the (contiguous) array is that slot of this process's mapping (another array over
    it, e.g. an input buffer reshaped): nothing to copy."""
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    if base is not region.map:  # memory of another owner (the address costs more to read)
        return False
    address = array.__array_interface__["data"][0]
    return address == slot.__array_interface__["data"][0] and array.nbytes == slot.nbytes


def _slots(sizes: Sequence[int], start: int, key: str) -> list[rknn_pb2.TensorRegion]:
    slots, offset = [], start
    for size in sizes:
        slots.append(rknn_pb2.TensorRegion(key=key, offset=offset, byte_length=size))
        offset += _aligned(size)
    return slots


def run_frame(
    session: Session,
    header: rknn_pb2.InferenceHeader,
    wire: Sequence[np.ndarray],
    progress: Callable[[int, int], None] | None = None,
) -> list[np.ndarray] | None:
    """The frame's outputs through shared memory, or None when it must go over the wire. Frames of
    one session from several threads take turns: they share its region (and the daemon runs one
    frame of a session at a time anyway). `progress` hears the inputs placed, then the outputs taken."""
    if not usable(session.device):
        return None
    with session.shm.lock:
        return _run_frame(session, header, wire, progress)


def _run_frame(
    session: Session,
    header: rknn_pb2.InferenceHeader,
    wire: Sequence[np.ndarray],
    progress: Callable[[int, int], None] | None,
) -> list[np.ndarray] | None:
    bound = session.shm.bound
    if bound is None or header is not bound.source or bound.session_id != session.id:
        room = _output_room(session, wire)  # a frame like the last one has its slots already
        bound = None if room is None else _bound(session, [a.nbytes for a in wire], room)
        if bound is None:
            return None
    shared = bound.frame_header(header, wire)
    region = bound.region
    for array, view in zip(wire, bound.slots, strict=True):
        if array is not view and not _is_slot(array, view, region):
            view[...] = array
    sent = sum([a.nbytes for a in wire]) if progress is not None else 0
    if progress is not None:
        progress(sent, sent)
    try:
        ran = _outputs_header(session, bound, shared)
    except SessionLost:
        raise
    except NotFound:  # the region is gone (unregistered, reaped): the next frame registers another
        session.shm.bound = None
        bound.hang_up()
        bound.region.close()
        return None
    except ResourceExhausted as exc:
        if exc.reason is not Reason.OUTPUT_SLOT_TOO_SMALL:
            raise
        session.shm.rooms.pop(_inputs_key(wire), None)  # outputs larger than learnt: by the wire,
        bound.source = None  # and the next frame's slots made again for what it shows
        return None
    session.last_run_time_us = ran.run_time_us
    views = bound.output_arrays(ran.outputs)
    if session.shm.lent:
        outputs = [view.view() for view in views]
    else:
        buffers = session.shm.buffers  # below MIN_POOLED_BYTES the pool hands out new memory anyway
        outputs = [view.copy() if view.nbytes < MIN_POOLED_BYTES else _copy(view, buffers) for view in views]
    if progress is not None:
        total = sent + sum(m.byte_length for m in ran.outputs)
        progress(total, total)
    return session.real_outputs(outputs)


def _copy(view: np.ndarray, buffers: BufferPool) -> np.ndarray:
    """A large output copied out of the region into memory of outputs the caller has dropped (no
    fresh pages to fault in and zero: for a 64 MiB output that cost more than the copy itself)."""
    copy = buffers.take(view.nbytes).view(view.dtype).reshape(view.shape)
    np.copyto(copy, view)
    return copy


def _outputs_header(
    session: Session, bound: _Bound, header: rknn_pb2.InferenceHeader
) -> rknn_pb2.OutputsHeader:
    """Ring the frame on the session's doorbell for this header (opened on first use), else send it
    as one RunShared call: where the daemon offers no doorbell or refuses one (then never again on
    this device), where it cannot take one now (asked again after DOORBELL_RETRY_S), or where the
    doorbell is lost (a newer one is opened for the next frame)."""
    device = session.device
    if device.shm.doorbells:
        if (bound.doorbell is None or bound.plan != bound.key) and time.monotonic() >= bound.retry_at:
            bound.hang_up()
            try:
                bound.doorbell, bound.plan = device.open_doorbell(header), bound.key
            except DoorbellLost as exc:  # the daemon's socket is crowded, or not in this namespace
                log.debug("%s; frames go as RunShared calls for now", exc)
                bound.retry_at = time.monotonic() + DOORBELL_RETRY_S
            except (SessionLost, NotFound):
                raise
            except RknnError as exc:  # refused: an older daemon, a policy
                log.debug("no doorbell from %s: %s", device.endpoint.description, exc)
                device.shm.doorbells = False
        doorbell = bound.doorbell  # read once: Device.close on another thread may hang it up meanwhile
        if doorbell is not None:
            try:
                return doorbell.ring(header.frame_id)
            except DoorbellLost as exc:
                log.debug("%s; the frame goes as a RunShared call", exc)
                bound.hang_up()
    return device.run_shared(header).header


__all__ = [
    "ENV",
    "disable",
    "enabled_by_env",
    "input_buffers",
    "lend_outputs",
    "run_frame",
    "usable",
    "use_doorbell",
]
