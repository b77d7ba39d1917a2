"""The shared-memory registry in-process: who may register, what may be opened, when it is closed.

A temporary folder stands in for /dev/shm; the test runs as some uid and registers as that uid (or
claims another one to play a second user)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

from rknn_server.board.peers import parse_peer
from rknn_server.core.shm import SharedMemoryRegistry, ShmLimits, refusal
from rknn_server.errors import InvalidInput, NotFound, PermissionDenied, ResourceExhausted

UID = os.getuid()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    return shm


def _registry(folder: Path, **limits: int) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(ShmLimits(**limits), idle_timeout_s=60.0, directory=folder)  # type: ignore[arg-type]


def _file(folder: Path, name: str, size: int) -> Path:
    path = folder / name
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    return path


def _open_fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


@pytest.mark.parametrize(
    ("peer", "uid", "enabled", "allowed"),
    [
        ("ipv4:127.0.0.1:5000", UID, True, True),
        ("ipv6:%5B::1%5D:5000", UID, True, True),
        ("ipv6:%5B::ffff:127.0.0.1%5D:5000", UID, True, True),
        ("ipv4:127.0.0.1:5000", UID, False, False),  # --shm off
        ("ipv4:127.0.0.1:5000", None, True, False),  # loopback, but the kernel did not name the user
        ("ipv4:192.0.2.7:5000", UID, True, False),  # another host
        ("ipv6:%5B2001:db8::1%5D:5000", UID, True, False),
        ("unix:", UID, True, False),  # adb forward: a PC behind adbd
        ("garbage", UID, True, False),
    ],
)
def test_only_named_loopback_callers_may_use_shared_memory(
    peer: str, uid: int | None, enabled: bool, allowed: bool
) -> None:
    assert (refusal(parse_peer(peer), uid, enabled) is None) is allowed


def test_a_remote_caller_is_refused_before_any_lookup(folder: Path) -> None:
    with pytest.raises(PermissionDenied, match="own host"):
        _registry(folder).admit("ipv4:192.0.2.7:5000")


@pytest.mark.parametrize("name", ["../etc/passwd", "a/b", "..", ".", "", "x" * 201, "a\0b", "sp ace"])
def test_names_outside_the_folder_are_refused(folder: Path, name: str) -> None:
    with pytest.raises(InvalidInput, match="plain file name"):
        _registry(folder).register("uid:0", UID, "k", name, 0, "")


def test_a_symlink_in_the_folder_is_not_followed(folder: Path, tmp_path: Path) -> None:
    secret = _file(tmp_path, "secret", 4096)
    (folder / "link").symlink_to(secret)
    with pytest.raises(PermissionDenied, match="cannot be opened"):
        _registry(folder).register("uid:0", UID, "k", "link", 0, "")


def test_only_regular_files_owned_by_the_caller(folder: Path) -> None:
    (folder / "dir").mkdir()
    os.mkfifo(folder / "fifo")
    _file(folder, "mine", 4096)
    registry = _registry(folder)
    with pytest.raises((InvalidInput, PermissionDenied)):
        registry.register("uid:0", UID, "d", "dir", 0, "")
    with pytest.raises(InvalidInput, match="not a regular file"):
        registry.register("uid:0", UID, "f", "fifo", 0, "")  # O_NONBLOCK: the open does not hang
    with pytest.raises(PermissionDenied, match="another user"):
        registry.register("uid:65534", 65534, "m", "mine", 0, "")
    assert len(registry) == 0


def test_the_size_is_the_files_and_a_wrong_claim_is_refused(folder: Path) -> None:
    _file(folder, "r", 5000)
    registry = _registry(folder)
    with pytest.raises(InvalidInput, match="5000 bytes, not the 9999"):
        registry.register("uid:0", UID, "k", "r", 9999, "")
    assert registry.register("uid:0", UID, "k", "r", 0, "").size == 5000


def test_caps_per_client(folder: Path) -> None:
    for i in range(3):
        _file(folder, f"r{i}", 1000)
    registry = _registry(folder, max_regions_per_client=2, max_bytes_per_client=1500)
    registry.register("uid:0", UID, "a", "r0", 0, "")
    with pytest.raises(ResourceExhausted, match="max_bytes_per_client=1500"):
        registry.register("uid:0", UID, "b", "r1", 0, "")
    registry = _registry(folder, max_regions_per_client=2)
    registry.register("uid:0", UID, "a", "r0", 0, "")
    registry.register("uid:0", UID, "b", "r1", 0, "")
    with pytest.raises(ResourceExhausted, match="max_regions_per_client=2"):
        registry.register("uid:0", UID, "c", "r2", 0, "")
    registry.register("uid:1", UID, "c", "r2", 0, "")  # another client has its own cap


def test_another_clients_region_is_not_found(folder: Path) -> None:
    _file(folder, "r", 1000)
    registry = _registry(folder)
    registry.register("alice", UID, "k", "r", 0, "")
    with pytest.raises(NotFound):
        registry.get("bob", "k")
    assert registry.unregister("bob") == 0
    with pytest.raises(NotFound):
        registry.unregister("bob", "k")
    assert registry.get("alice", "k").key == "k"


def test_slots_outside_the_region_and_a_truncated_file_fail_without_harm(folder: Path) -> None:
    path = _file(folder, "r", 4096)
    region = _registry(folder).register("uid:0", UID, "k", "r", 0, "")
    with pytest.raises(InvalidInput, match="outside region"):
        region.check_slot(4000, 100, "input 0")
    buffer = np.empty(1024, np.uint8)
    region.read_into(buffer, 1024, "input 0")
    assert bytes(buffer) == path.read_bytes()[1024:2048]
    os.truncate(path, 1500)  # the client shrinks its file after registering it
    with pytest.raises(InvalidInput, match="truncated"):
        region.read_into(buffer, 1024, "input 0")
    region.write(np.arange(4, dtype=np.float32), 2048)  # grows the file back; no fault
    assert np.array_equal(np.fromfile(path, np.float32, 4, offset=2048), np.arange(4, dtype=np.float32))


def test_closed_on_unregister_with_its_session_and_when_idle(folder: Path) -> None:
    for name in ("a", "b", "c"):
        _file(folder, name, 1000)
    registry = _registry(folder)
    registry.idle_timeout_s = 0.0
    registry.register("uid:0", UID, "a", "a", 0, "")
    registry.register("uid:0", UID, "b", "b", 0, "session-1")
    registry.register("uid:0", UID, "c", "c", 0, "session-2")
    held = lambda: {Path(p).name for p in _open_fds() if p.startswith(str(folder))}  # noqa: E731
    assert held() == {"a", "b", "c"}
    registry.session_closed("session-1")
    assert held() == {"a", "c"}
    registry.reap()  # idle: only the region tied to no session goes
    assert held() == {"c"}
    registry.unregister("uid:0")
    assert held() == set()


def test_a_region_in_use_is_closed_when_its_call_ends(folder: Path) -> None:
    _file(folder, "a", 1000)
    registry = _registry(folder)
    region = registry.register("uid:0", UID, "a", "a", 0, "s")
    registry.acquire([region, region])
    registry.session_closed("s")
    assert region.fd >= 0  # a read in flight keeps its descriptor
    with pytest.raises(NotFound):
        registry.get("uid:0", "a")
    registry.release([region, region])
    assert region.fd == -1 and region.uses == 1
