"""The adbd emulator's view of an emulated board: its shell runs inside the board, its files are the
board's own, through the namespaces of tests/board/machine.py."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.adb.services import DeviceProfile
from tests.board.machine import Board

# Where the emulator keeps its process view (tests/adb/board_processes.py) for a board: in the board's
# throw-away overlay, so it vanishes with the board.
_PROCESS_VIEW = "/tmp/.adbd-emulator-proc"


@dataclass
class BoardProfile(DeviceProfile):
    """A DeviceProfile whose `root` is the board's `/`: every path is a board path, and a shell
    command is the board's /bin/sh in the board's namespaces, with `board_env` as the board's own
    environment (what /etc/default would set there)."""

    board: Board | None = None
    board_env: dict[str, str] = field(default_factory=dict)

    def is_board_path(self, path: str) -> bool:
        return True

    def local_path(self, board_path: str) -> Path:
        """The board's path, but `/proc` itself names a folder in the board's /tmp: before each shell command the
        emulator prunes its process view there (board_processes.sync_view), and the board's /proc is a
        real procfs of its PID namespace, which needs no view; unlinking its entries fails with EPERM,
        the shell: service never opens and the host waits forever for its OKAY. Paths under /proc
        are the board's own."""
        if board_path.rstrip("/") == "/proc":
            return super().local_path(_PROCESS_VIEW)
        return super().local_path(board_path)

    def shell_script(self, command: str) -> str:
        assert self.board is not None
        overrides = "".join(f"{name}() {{ {body}\n}}\n" for name, body in self.commands.items())
        inner = self._getprop_function() + overrides + command
        return "exec " + shlex.join(self.board.command(inner, self.board_env))


def board_profile(board: Board, serial_name: str, **settings: object) -> BoardProfile:
    return BoardProfile(board.root, serial_name=serial_name, board=board, **settings)  # type: ignore[arg-type]
