"""How a daemon says where it listens, machine-readably: the `listening on ADDR` lines on its standard
output (one per listener, once serving) and the JSON file of `--ready-file`.

Both are contracts that scripts, tests and the client's private daemon read, so their format and
parser live here, once. The ready file appears atomically (written beside, then renamed) only when
the daemon serves, so a supervisor can wait for it instead of parsing output.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

LISTENING_PREFIX = "listening on "
_TCP = "tcp://"


def listening_line(address: str) -> str:
    """The line a daemon prints for one bound listener (`tcp://127.0.0.1:50515`, `unix-abstract:NAME`)."""
    return f"{LISTENING_PREFIX}{address}"


def tcp_address(line: str) -> str | None:
    """`HOST:PORT` of a `listening on tcp://HOST:PORT` line; None for any other line."""
    text = line.strip()
    if not text.startswith(LISTENING_PREFIX + _TCP):
        return None
    return text.removeprefix(LISTENING_PREFIX + _TCP)


def wait_tcp_address(lines: Iterable[str], timeout_s: float) -> str | None:
    """The first `listening on tcp://` address among `lines` (a daemon's stdout pipe), None if none
    comes within `timeout_s` (the daemon died or is stuck). Read on a daemon thread, so a silent
    daemon cannot hold the caller past the timeout; reading stops at the address."""
    found: list[str] = []

    def read() -> None:
        for line in lines:
            address = tcp_address(line)
            if address is not None:
                found.append(address)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    return found[0] if found else None


@dataclass(frozen=True)
class ReadyInfo:
    """What `--ready-file` holds: the bound listeners (ports resolved), and which daemon run it is."""

    pid: int
    version: str
    instance_id: str
    listen: list[str] = field(default_factory=list)
    metrics: str = ""

    def tcp_addresses(self) -> list[str]:
        """`HOST:PORT` of each TCP listener, in --listen order."""
        return [a.removeprefix(_TCP) for a in self.listen if a.startswith(_TCP)]


def write_ready_file(path: Path, info: ReadyInfo) -> None:
    """Write `info` as JSON so that a reader sees either no file or the whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(asdict(info), file, indent=2)
            file.write("\n")
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_ready_file(path: Path) -> ReadyInfo:
    """The daemon's ready file; raises OSError while it is absent, ValueError when it is not one."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("listen"), list):
        raise ValueError(f"{path} is not a rknn_server ready file")
    return ReadyInfo(
        pid=int(data["pid"]),
        version=str(data["version"]),
        instance_id=str(data["instance_id"]),
        listen=[str(a) for a in data["listen"]],
        metrics=str(data.get("metrics", "")),
    )


__all__ = [
    "LISTENING_PREFIX",
    "ReadyInfo",
    "listening_line",
    "read_ready_file",
    "tcp_address",
    "wait_tcp_address",
    "write_ready_file",
]
