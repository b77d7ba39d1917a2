"""The emulated board's process table, so its shell never sees this machine's other processes.

A process is on the board when its environment carries the board's marker: the board's shells and
everything they start, or a process a test starts with `DeviceProfile.process_env()`. Before each shell
command the board's `/proc` (under its root) gets one link per such process to the host's `/proc/PID`;
the shell reads `/proc/PID/...` and `/proc/[0-9]*` there, and its `ps`, `pidof` and `killall` are
functions over it. A process started and looked up within one shell command is not seen.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

MARKER = "EMULATED_BOARD_ID"
HOST_PROC = Path("/proc")


def board_pids(board_id: str) -> set[int]:
    """The host PIDs whose environment names this board (processes of other users are unreadable)."""
    marker = f"{MARKER}={board_id}".encode()
    found = set()
    for entry in HOST_PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def sync_view(view: Path, board_id: str) -> None:
    """Make `view` (the board's /proc) hold one link per board process and none for the others."""
    view.mkdir(parents=True, exist_ok=True)
    wanted = board_pids(board_id)
    for entry in view.iterdir():
        if entry.name.isdigit() and int(entry.name) not in wanted:
            entry.unlink()
    for pid in wanted:
        link = view / str(pid)
        if not link.is_symlink():
            link.symlink_to(HOST_PROC / str(pid))


def shims(view: Path) -> str:
    """`ps`, `pidof` and `killall` over the board's processes, as procps matches them: ps lists each
    process's comm, pidof matches the basename of argv[0] or of the executable, killall the comm."""
    each = f'for d in {shlex.quote(str(view))}/[0-9]*; do [ -r "$d/comm" ] || continue; '
    return (
        'ps() { echo "  PID TTY          TIME CMD"; '
        + each
        + 'printf "%5s ?        00:00:00 %s\\n" "${d##*/}" "$(cat "$d/comm")"; done; }\n'
        "pidof() { _found=; "
        + each
        + '_argv0=$(tr "\\0" "\\n" <"$d/cmdline" | head -n 1); _exe=$(readlink "$d/exe"); '
        'for _name in "$@"; do if [ "${_argv0##*/}" = "$_name" ] || [ "${_exe##*/}" = "$_name" ]; then '
        '_found="$_found ${d##*/}"; fi; done; done; '
        '[ -n "$_found" ] && echo ${_found# }; }\n'
        'killall() { _signal=-TERM; case "$1" in -*) _signal=$1; shift;; esac; _status=0; '
        'for _name in "$@"; do _killed=; '
        + each
        + '[ "$(cat "$d/comm")" = "$(printf %.15s "$_name")" ] && kill "$_signal" "${d##*/}" && _killed=1; '
        'done; [ -n "$_killed" ] || { echo "$_name: no process found" >&2; _status=1; }; done; '
        "return $_status; }\n"
    )


def environment(board_id: str) -> dict[str, str]:
    """The environment of a process on the board."""
    return os.environ | {MARKER: board_id}
