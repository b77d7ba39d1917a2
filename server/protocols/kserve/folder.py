"""Reading a folder that someone else can write, without following their links or trusting a path twice.

A model folder of the repository is hostile content: whoever can write it can swap the folder, or
anything in it, for a symbolic link, a named pipe or a device while the daemon reads it. So a folder
is opened once (`O_DIRECTORY|O_NOFOLLOW`, relative to its parent's descriptor) and everything in it
is listed, opened and read through that descriptor: each file `O_NOFOLLOW|O_NONBLOCK` (a named pipe
cannot block the open), checked with `fstat` to be a regular file, and read only up to the size that
was checked. No path is resolved again, so a link swapped in anywhere is refused, never followed.
Messages name entries by their names in the folder, never by a server path.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from types import TracebackType

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
READ_BYTES = 4 << 20
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a subfolder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


class UnsafeEntry(ValueError):
    """An entry that is not a plain file (a link, a pipe, a device, a subfolder)."""


class FileChanged(ValueError):
    """A file that changed or went away while it was read."""


def kind_of(mode: int) -> str:
    """What an entry is, for a message; empty for a regular file."""
    return next((kind for test, kind in _KINDS if test(mode)), "" if stat.S_ISREG(mode) else "not a file")


def _shown(name: str) -> str:
    return repr(name[:80])


def open_folder(name: str | os.PathLike[str], parent_fd: int | None = None) -> int:
    """A descriptor of the folder `name` (relative to `parent_fd`), never through a symbolic link;
    raises FileNotFoundError, or UnsafeEntry for a link or anything but a folder."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeEntry("is a symbolic link") from None
        if exc.errno == errno.ENOTDIR:
            raise UnsafeEntry("is not a folder") from None
        raise


class PlainFile:
    """One regular file of a folder, open; its size is the one checked when it was opened."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.info = os.fstat(fd)
        self.size = self.info.st_size

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PlainFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def blocks(self) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of the file up to the size checked at open; it must still hold them."""
        offset = 0
        while offset < self.size:
            block = os.pread(self.fd, min(READ_BYTES, self.size - offset), offset)
            if not block:
                raise FileChanged(f"{_shown(self.name)} shrank while it was read; try again")
            yield offset, block
            offset += len(block)

    def read_at_most(self, limit: int) -> bytes:
        """The whole file, refused unread past `limit` bytes (at most limit + 1 are ever read)."""
        if self.size > limit:
            raise UnsafeEntry(f"{_shown(self.name)} is {self.size} bytes, over {limit}")
        data = os.pread(self.fd, limit + 1, 0)
        if len(data) > limit:
            raise UnsafeEntry(f"{_shown(self.name)} is over {limit} bytes")
        return data

    def same_as(self, info: os.stat_result) -> bool:
        """The same file, unchanged: the inode, size and modification time of `info` (an earlier fstat)."""
        a, b = self.info, info
        return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (
            b.st_dev,
            b.st_ino,
            b.st_size,
            b.st_mtime_ns,
        )


class Folder:
    """A folder opened once; everything in it is listed and opened through its descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, name: str | os.PathLike[str], parent_fd: int | None = None) -> Folder:
        return cls(open_folder(name, parent_fd))

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Folder:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def entries(self, limit: int) -> dict[str, os.stat_result]:
        """Name -> lstat of each entry not starting with '.', in name order; the listing stops at
        `limit` entries (a caller given that many knows there are at least that many)."""
        found: dict[str, os.stat_result] = {}
        with os.scandir(self.fd) as listing:
            for entry in listing:
                if len(found) == limit:
                    break
                if not entry.name.startswith("."):
                    found[entry.name] = entry.stat(follow_symlinks=False)
        return dict(sorted(found.items()))

    def open_file(self, name: str) -> PlainFile:
        """A regular file of this folder: refused if it is a link, a pipe, a device or a subfolder."""
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeEntry(f"{_shown(name)} is a symbolic link") from None
            if exc.errno == errno.ENOENT:
                raise FileChanged(f"{_shown(name)} is no longer in the folder; try again") from None
            raise
        found = PlainFile(name, fd)
        kind = kind_of(found.info.st_mode)
        if kind:
            found.close()
            raise UnsafeEntry(f"{_shown(name)} is {kind}")
        return found


__all__ = ["FileChanged", "Folder", "PlainFile", "UnsafeEntry", "kind_of", "open_folder"]
