"""Shared-memory regions of same-host clients: who may register one, what is opened, and when it goes.

Triton's system shared-memory extension is the model; this one is stricter:

- **Who**: only a caller on this machine whose user the kernel names (a loopback TCP caller, which
  sock_diag maps to its uid, see peers.py). A remote address is refused, and so is a unix-socket
  caller: on a board that is adbd relaying a PC (another host), and grpc shows no SO_PEERCRED.
- **What**: a plain file name in the shared-memory folder (/dev/shm), opened relative to that folder
  with O_NOFOLLOW (no '/', no '..', no links), which must be a regular file owned by the caller's
  uid. Its size is the file's (fstat), never the client's word. Each client has a count and byte cap.
- **Or a sealed memfd**: a client in the daemon's PID namespace may instead name one of its own
  descriptors (pid, fd), a memfd sealed against shrinking (F_SEAL_SHRINK). It is opened as an
  O_PATH reference first (no side effects, whatever the descriptor is), checked (a regular file of
  the caller's uid) and only then reopened for reading and writing through that pinned reference,
  and its seals are checked before it is mapped.
- **How it is read and written**: a /dev/shm file through the open descriptor with preadv/pwritev,
  never through a mapping. A client may truncate such a file at any time, and touching a mapping
  beyond the end of a shrunk file raises SIGBUS, which would kill the daemon; the kernel's copy
  reports a short count instead. The price is one copy per tensor each way (into a buffer the frame
  memory budget counts, and out of the runtime's output). A sealed memfd cannot shrink, so it is
  mapped: inputs are numpy views over the mapping (no copy) and outputs are copied into it once.
- **When it goes**: on unregister, when the session it was registered for closes (release, idle
  reaper, shutdown), or, for a region tied to no session, after the session idle timeout without
  use. A region in use by a call is closed once that call ends (its descriptor number is never
  reused under a read in flight).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rknn_server.board.peers import Listener, Peer, parse_peer, socket_owner
from rknn_server.errors import InvalidInput, NotFound, PermissionDenied, ResourceExhausted

SHM_DIR = Path("/dev/shm")
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_KEY = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


@dataclass(frozen=True)
class ShmLimits:
    """Whether shared memory is offered (--shm), and how much one client may register."""

    enabled: bool = True
    max_regions_per_client: int = 32
    max_bytes_per_client: int = 16 << 30
    max_regions: int = 1024


def boot_id() -> str:
    """This kernel's boot id: one per host (containers share it), another after a reboot."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def refusal(peer: Peer, uid: int | None, enabled: bool) -> str | None:
    """Why this caller may not use shared memory, or None when it may."""
    if not enabled:
        return "shared memory is off on this daemon (--shm off)"
    if peer.family == "unix":
        return "a unix-socket caller (e.g. adb forward) may be on another host; connect over loopback TCP"
    if not peer.is_local:
        return "shared memory is only for callers on the daemon's own host (loopback)"
    if uid is None:
        return "the kernel does not name the user of this connection, so its regions cannot be checked"
    return None


@dataclass(eq=False)
class Region:
    """One registered file, held open by descriptor."""

    key: str
    name: str
    owner: str
    fd: int
    size: int
    device: int
    inode: int
    session_id: str
    map: mmap.mmap | None = None  # a sealed memfd's mapping; None: read and written by descriptor
    last_used: float = field(default_factory=time.monotonic)
    uses: int = 0
    users: int = 0  # calls reading or writing it right now
    closed: bool = False

    def check_slot(self, offset: int, length: int, what: str) -> None:
        """A slot must lie inside the region (as registered: the file's size then)."""
        if offset + length > self.size:
            raise InvalidInput(
                f"{what}: bytes {offset}..{offset + length} lie outside region {self.key!r} of "
                f"{self.size} bytes"
            )

    def view(self, offset: int, length: int) -> np.ndarray:
        """The slot's bytes in place (a mapped region only)."""
        assert self.map is not None
        return np.frombuffer(self.map, np.uint8, length, offset)

    def read_into(self, buffer: np.ndarray, offset: int, what: str) -> None:
        """Copy the slot at `offset` into `buffer` (uint8, its size is the slot's)."""
        view = buffer.data  # the buffer's own memory: the kernel copies straight into it
        done = os.preadv(self.fd, [view], offset) if buffer.nbytes else 0
        while 0 < done < buffer.nbytes:  # preadv may stop short on a huge read; a 0 is the file's end
            step = os.preadv(self.fd, [view[done:]], offset + done)
            if step == 0:
                break
            done += step
        if done != buffer.nbytes:
            raise InvalidInput(
                f"{what}: region {self.key!r} ended after {offset + done} bytes, before its slot's end "
                f"at {offset + buffer.nbytes}; the file was truncated after it was registered"
            )

    def write(self, array: np.ndarray, offset: int) -> None:
        """Copy a contiguous array's bytes into the slot at `offset` (already checked to fit)."""
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if self.map is not None:
            self.view(offset, data.nbytes)[:] = data
            return
        done = 0
        try:
            while done < data.nbytes:
                done += os.pwritev(self.fd, [data.data[done:]], offset + done)
        except OSError as exc:  # ENOSPC: the client's tmpfs is full
            raise ResourceExhausted(f"writing into region {self.key!r} failed: {exc.strerror}") from None


class SharedMemoryRegistry:
    """Every client's regions, by owner identity and key. Runs on the event loop; only the
    descriptor reads and writes happen in executor threads, between `acquire` and `release`."""

    def __init__(
        self,
        limits: ShmLimits,
        idle_timeout_s: float,
        listeners: Sequence[Listener] = (),
        directory: Path = SHM_DIR,
    ) -> None:
        self.limits = limits
        self.idle_timeout_s = idle_timeout_s
        self.listeners = listeners  # the daemon's TCP listeners, filled in once bound
        self.directory = directory
        self.boot_id = boot_id()
        self._regions: dict[tuple[str, str], Region] = {}
        # Sessions close in executor threads (DataPlane.on_close); everything else runs on the loop.
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._regions)

    # -- Who may ------------------------------------------------------------------------------

    def caller_uid(self, peer_text: str, lookup: bool = True) -> tuple[Peer, int | None]:
        """The caller's address and, for a loopback TCP caller, the uid owning its socket (when
        `lookup`: one sock_diag query, done at registration; a run only needs the address)."""
        peer = parse_peer(peer_text)
        if peer.family == "unix" or not peer.is_local:
            return peer, None
        return peer, socket_owner(peer, self.listeners) if lookup else -1

    def admit(self, peer_text: str, lookup: bool = True) -> int:
        """The caller's uid when it may use shared memory; raises PermissionDenied saying why not."""
        peer, uid = self.caller_uid(peer_text, lookup)
        reason = refusal(peer, uid, self.limits.enabled)
        if reason is not None or uid is None:
            raise PermissionDenied(f"shared memory refused: {reason}")
        return uid

    def refusal_for(self, peer_text: str) -> str | None:
        peer, uid = self.caller_uid(peer_text)
        return refusal(peer, uid, self.limits.enabled)

    # -- Registering ----------------------------------------------------------------------------

    def register(
        self,
        owner: str,
        uid: int,
        key: str,
        name: str,
        size: int,
        session_id: str,
        memfd: tuple[int, int] | None = None,
    ) -> Region:
        """Open and check a region: `name` in the folder, or `memfd` = (pid, fd), a sealed memfd
        (whose `name`, if any, is only a label)."""
        if not _KEY.fullmatch(key):
            raise InvalidInput(f"region key {key!r} is not 1 to 64 letters, digits, '.', '_' or '-'")
        if (memfd is None or name) and (not _NAME.fullmatch(name) or name in (".", "..")):
            raise InvalidInput(
                f"region name {name!r} is not a plain file name in the shared-memory folder "
                "(letters, digits, '.', '_', '-'; no '/')"
            )
        with self._lock:
            if (owner, key) in self._regions:
                raise InvalidInput(f"region key {key!r} is already registered; unregister it first")
            mine = [r for r in self._regions.values() if r.owner == owner]
            if len(mine) >= self.limits.max_regions_per_client or len(self) >= self.limits.max_regions:
                raise ResourceExhausted(
                    f"this client has {len(mine)} regions registered, the limit max_regions_per_client="
                    f"{self.limits.max_regions_per_client} (daemon-wide {self.limits.max_regions}); "
                    "unregister some first"
                )
            fd, info, region_map = self._open_checked(name, memfd, uid, size, sum(r.size for r in mine))
            region = Region(
                key, name, owner, fd, info.st_size, info.st_dev, info.st_ino, session_id, region_map
            )
            self._regions[(owner, key)] = region
            return region

    def _open_checked(
        self, name: str, memfd: tuple[int, int] | None, uid: int, size: int, held: int
    ) -> tuple[int, os.stat_result, mmap.mmap | None]:
        """The region's file opened and checked (a regular file of the caller's, of the size the
        client sent, within its byte quota beside the `held` bytes it has; a memfd sealed and mapped):
        its fd, its stat and the memfd's mapping."""
        fd = self._open(name) if memfd is None else _open_memfd(*memfd, uid)
        what = f"{name!r} in the shared-memory folder" if memfd is None else "the memfd"
        region_map = None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"{what} is not a regular file")
            if info.st_uid != uid:
                raise PermissionDenied(f"{what} belongs to another user than the caller")
            if size and size != info.st_size:
                raise InvalidInput(f"region {name!r} is {info.st_size} bytes, not the {size} the client sent")
            if held + info.st_size > self.limits.max_bytes_per_client:
                raise ResourceExhausted(
                    f"regions of {held + info.st_size} bytes would be registered by this client, over "
                    f"the limit max_bytes_per_client={self.limits.max_bytes_per_client}"
                )
            if memfd is not None:
                try:
                    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
                except OSError:  # EINVAL: a file of a filesystem without seals, not a memfd
                    seals = 0
                if not seals & fcntl.F_SEAL_SHRINK or info.st_size == 0:
                    raise InvalidInput("the memfd is not sealed against shrinking (F_SEAL_SHRINK)")
                try:
                    region_map = mmap.mmap(fd, info.st_size)
                except OSError as exc:  # e.g. sealed against writing (F_SEAL_WRITE)
                    raise InvalidInput(
                        f"the memfd cannot be mapped for reading and writing: {exc.strerror}"
                    ) from None
        except BaseException:
            os.close(fd)
            raise
        return fd, info, region_map

    def _open(self, name: str) -> int:
        """Open `name` inside the folder: no links followed, nothing outside it, no blocking open."""
        try:
            folder = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise NotFound("this daemon's host has no shared-memory folder") from None
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            return os.open(name, flags, dir_fd=folder)
        except FileNotFoundError:
            raise NotFound(
                f"no file {name!r} in the daemon's shared-memory folder (another host, or a container "
                "that does not share /dev/shm with the daemon)"
            ) from None
        except OSError as exc:
            raise PermissionDenied(
                f"{name!r} in the shared-memory folder cannot be opened: {exc.strerror}"
            ) from None
        finally:
            os.close(folder)

    # -- Using ----------------------------------------------------------------------------------

    def get(self, owner: str, key: str) -> Region:
        """The owner's region; another client's is as unknown as a wrong key."""
        with self._lock:
            region = self._regions.get((owner, key))
            if region is None:
                raise NotFound(f"no shared-memory region {key!r} is registered by this client")
            return region

    def mine(self, owner: str, key: str = "") -> list[Region]:
        with self._lock:
            if key:
                return [self.get(owner, key)]
            return [r for r in self._regions.values() if r.owner == owner]

    def acquire(self, regions: Sequence[Region]) -> None:
        """Count a call in on its regions (each once, however many of its slots it holds)."""
        with self._lock:
            for region in dict.fromkeys(regions):
                region.users += 1
                region.uses += 1
                region.last_used = time.monotonic()

    def release(self, regions: Sequence[Region]) -> None:
        with self._lock:
            for region in dict.fromkeys(regions):
                region.users -= 1
                region.last_used = time.monotonic()
                self._close_if_free(region)

    # -- Going ----------------------------------------------------------------------------------

    def unregister(self, owner: str, key: str = "") -> int:
        with self._lock:
            regions = self.mine(owner, key)
            for region in regions:
                self._drop(region)
            return len(regions)

    def session_closed(self, session_id: str) -> None:
        """Close the regions registered for a session that is gone."""
        with self._lock:
            for region in [r for r in self._regions.values() if r.session_id == session_id]:
                self._drop(region)

    def reap(self) -> None:
        """Close regions tied to no session that went unused for the idle timeout."""
        with self._lock:
            cutoff = time.monotonic() - self.idle_timeout_s
            for region in [r for r in self._regions.values() if not r.session_id and r.last_used < cutoff]:
                if region.users == 0:
                    self._drop(region)

    def close_all(self) -> None:
        with self._lock:
            for region in list(self._regions.values()):
                self._drop(region)

    def _drop(self, region: Region) -> None:
        self._regions.pop((region.owner, region.key), None)
        region.closed = True
        self._close_if_free(region)

    def _close_if_free(self, region: Region) -> None:
        if region.closed and region.users == 0 and region.fd >= 0:
            os.close(region.fd)
            region.fd = -1
            if region.map is not None:
                with contextlib.suppress(BufferError):  # a view still alive: unmapped when it goes
                    region.map.close()


def _open_memfd(pid: int, fd: int, uid: int) -> int:
    """Reopen descriptor `fd` of process `pid` (in this PID namespace) for reading and writing.

    An O_PATH open of the /proc magic link pins the inode without opening the file (no side effect,
    whatever the descriptor is: a device, a FIFO); only a regular file of the caller's uid is then
    reopened, through the pinned reference, so the process cannot swap the descriptor in between."""
    try:
        pinned = os.open(f"/proc/{pid}/fd/{fd}", os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        raise NotFound(
            f"no descriptor {fd} of process {pid} is visible to the daemon (another PID namespace?)"
        ) from None
    except OSError as exc:
        raise PermissionDenied(f"descriptor {fd} of process {pid} cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(pinned)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"descriptor {fd} of process {pid} is not a memfd")
        if info.st_uid != uid:
            raise PermissionDenied(
                f"descriptor {fd} of process {pid} belongs to another user than the caller"
            )
        return os.open(f"/proc/self/fd/{pinned}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise PermissionDenied(f"descriptor {fd} of process {pid} cannot be opened: {exc.strerror}") from None
    finally:
        os.close(pinned)


__all__ = ["Region", "SharedMemoryRegistry", "ShmLimits", "boot_id", "refusal"]
