"""The services the emulated adbd offers: shell:, exec:, tcp:, localabstract:, local:, sync:."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import struct
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.adb import board_processes
from tests.adb.stream import Stream, StreamBytes, relay

# Board paths that live in the fake device root rather than on this machine.
DEFAULT_BOARD_PATHS = (
    "/opt",
    "/data",
    "/userdata",
    "/oem",
    "/sdcard",
    "/vendor",
    "/system",
    "/proc/device-tree",
    "/sys/kernel/debug/rknpu",
    "/sys/module/rknpu",
    "/dev/rknpu",
    "/dev/dri",
    "/dev/socket",
    "/usr/bin/rknn_server",
    "/usr/bin/start_rknn.sh",
    "/usr/bin/restart_rknn.sh",
    "/usr/lib/librknnrt.so",
)
# adb's SYNC_DATA_MAX: the largest DATA frame either side sends.
SYNC_DATA_MAX = 64 * 1024
_ABS_PATH = re.compile(r"(?<![\w./-])/[\w.@+/-]*")
# A path into one process's /proc entry, or `/proc/` before a glob or a variable (`/proc/[0-9]*`, `/proc/$p`).
_PROCESS_PATH = re.compile(r"/proc/(\d+(/.*)?)?")


@dataclass
class DeviceProfile:
    """What the emulated board looks like: its banner, properties and files."""

    root: Path
    serial_name: str = "emulated"
    model: str = "Emulated RK3588 board"
    props: dict[str, str] = field(default_factory=dict)
    board_paths: tuple[str, ...] = DEFAULT_BOARD_PATHS
    # Board abstract socket name -> the local one serving it, so concurrent test runs never share a name.
    abstract_sockets: dict[str, str] = field(default_factory=dict)
    # Shell functions standing in for board commands (e.g. `uname`, `python3`): name -> body.
    commands: dict[str, str] = field(default_factory=dict)
    # Extra environment for shell commands.
    env: dict[str, str] = field(default_factory=dict)
    # What marks a host process as one of this board's (tests/adb/board_processes.py).
    board_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def all_props(self) -> dict[str, str]:
        base = {
            "ro.product.name": self.serial_name,
            "ro.product.model": self.model,
            "ro.product.device": self.serial_name,
            "ro.serialno": self.serial_name,
        }
        return base | self.props

    def banner(self) -> bytes:
        props = self.all_props()
        keys = ("ro.product.name", "ro.product.model", "ro.product.device")
        fields = ";".join(f"{key}={props[key]}" for key in keys)
        return f"device::{fields};features=fixed_push_mkdir".encode()

    def local_path(self, board_path: str) -> Path:
        """Where a board path lives in the fake device root."""
        return self.root / board_path.lstrip("/")

    def is_board_path(self, path: str) -> bool:
        return any(path == prefix or path.startswith(prefix + "/") for prefix in self.board_paths)

    def process_env(self) -> dict[str, str]:
        """The environment of a process on this board: its shells', or one a test starts there."""
        return board_processes.environment(self.board_id) | self.env

    def shell_script(self, command: str) -> str:
        """The command with board paths moved into the root, behind a getprop answering from props and
        ps/pidof/killall over the board's own processes."""
        rewritten = _ABS_PATH.sub(lambda match: self._board_side(match.group(0)), command)
        overrides = "".join(f"{name}() {{ {body}\n}}\n" for name, body in self.commands.items())
        shims = board_processes.shims(self.local_path("/proc"))
        return self._getprop_function() + shims + overrides + rewritten

    def _board_side(self, path: str) -> str:
        """Where the shell finds `path`: in the root for board paths and process entries, else as is."""
        if not (self.is_board_path(path) or _PROCESS_PATH.fullmatch(path)):
            return path
        return str(self.local_path(path)) + ("/" if path.endswith("/") else "")

    def abstract_socket(self, board_name: str) -> str:
        """The local abstract socket that serves the board's `board_name`."""
        return self.abstract_sockets.get(board_name, board_name)

    def _getprop_function(self) -> str:
        props = self.all_props()
        cases = "".join(
            f"{shlex.quote(key)}) printf '%s\\n' {shlex.quote(value)};; " for key, value in props.items()
        )
        listing = "".join(f"[{key}]: [{value}]\n" for key, value in sorted(props.items()))
        return (
            f'getprop() {{ case "$1" in {cases}'
            f"'') printf '%s' {shlex.quote(listing)};; *) echo;; esac; }}\n"
        )


Handler = Callable[[Stream], Awaitable[None]]


async def open_service(name: str, profile: DeviceProfile) -> Handler | None:
    """The handler for a service name, or None to refuse it (the host then sees CLSE)."""
    for prefix in ("shell:", "exec:"):
        if name.startswith(prefix):
            return await _open_shell(name[len(prefix) :], profile)
    if name.startswith("tcp:"):
        return await _open_socket(asyncio.open_connection("127.0.0.1", int(name[4:].rsplit(":", 1)[-1])))
    if name.startswith("localabstract:"):
        local = profile.abstract_socket(name[len("localabstract:") :])
        return await _open_socket(asyncio.open_unix_connection("\0" + local))
    if name.startswith("local:"):
        return await _open_reserved(name[len("local:") :], profile)
    if name == "sync:":
        return lambda stream: _serve_sync(stream, profile)
    return None


async def _open_reserved(name: str, profile: DeviceProfile) -> Handler | None:
    """adbd's reserved namespace: `/dev/socket/NAME` under the board root when it exists, else `@NAME`."""
    if not name or "/" in name:
        return None
    path = profile.local_path(f"/dev/socket/{name}")
    if path.is_socket():
        return await _open_socket(asyncio.open_unix_connection(str(path)))
    return await _open_socket(asyncio.open_unix_connection("\0" + profile.abstract_socket(name)))


Connecting = Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


async def _open_socket(connecting: Connecting) -> Handler | None:
    try:
        reader, writer = await connecting
    except OSError:
        return None
    return lambda stream: relay(stream, reader, writer)


async def _open_shell(command: str, profile: DeviceProfile) -> Handler:
    board_processes.sync_view(profile.local_path("/proc"), profile.board_id)
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        profile.shell_script(command or "exec /bin/sh -i"),
        cwd=profile.root,
        env=profile.process_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )

    async def serve(stream: Stream) -> None:
        assert process.stdout is not None and process.stdin is not None
        try:
            await relay(stream, process.stdout, process.stdin)
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()

    return serve


async def _serve_sync(stream: Stream, profile: DeviceProfile) -> None:
    """The sync: file protocol (SYNC.TXT): STAT, SEND, RECV and QUIT."""
    frames = StreamBytes(stream)
    try:
        while True:
            request = await frames.read_exactly(8)
            kind, length = request[:4], struct.unpack("<I", request[4:])[0]
            if kind == b"QUIT":
                return
            argument = (await frames.read_exactly(length)).decode()
            if kind == b"STAT":
                await stream.send(b"STAT" + _stat(profile.local_path(argument)))
            elif kind == b"SEND":
                await stream.send(await _receive_file(frames, profile, argument))
            elif kind == b"RECV":
                await _send_file(stream, profile.local_path(argument))
            else:
                await stream.send(_fail(f"unsupported sync request {kind!r}"))
                return
    except (EOFError, ConnectionResetError):
        return
    finally:
        stream.close()


def _stat(path: Path) -> bytes:
    try:
        info = path.stat()
    except OSError:
        return struct.pack("<3I", 0, 0, 0)
    return struct.pack("<3I", info.st_mode, info.st_size & 0xFFFFFFFF, int(info.st_mtime))


def _fail(message: str) -> bytes:
    data = message.encode()
    return b"FAIL" + struct.pack("<I", len(data)) + data


async def _receive_file(frames: StreamBytes, profile: DeviceProfile, argument: str) -> bytes:
    board_path, _, mode = argument.rpartition(",")
    target = profile.local_path(board_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".adbpart")
    with partial.open("wb") as output:
        while True:
            header = await frames.read_exactly(8)
            kind, length = header[:4], struct.unpack("<I", header[4:])[0]
            if kind == b"DATA":
                output.write(await frames.read_exactly(length))
            elif kind == b"DONE":
                break
            else:
                return _fail(f"unexpected {kind!r} during SEND")
    os.replace(partial, target)
    target.chmod(int(mode) & 0o7777)
    os.utime(target, (length, length))
    return b"OKAY" + struct.pack("<I", 0)


async def _send_file(stream: Stream, path: Path) -> None:
    try:
        data = path.read_bytes()
    except OSError as error:
        await stream.send(_fail(f"cannot read {path.name}: {error.strerror}"))
        return
    for start in range(0, len(data), SYNC_DATA_MAX):
        chunk = data[start : start + SYNC_DATA_MAX]
        await stream.send(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
    await stream.send(b"DONE" + struct.pack("<I", 0))
