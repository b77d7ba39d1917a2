"""The venv with the real `tritonclient` that the KServe v2 wire tests drive the daemon with.

tritonclient pins its own protobuf and grpcio, so it never shares the project's interpreter: it lives
in a venv of its own in the user's cache folder (like the toolkit's), made once and reused; a venv
without the stamp (an interrupted install) is made again. `python -m tests.kserve.tritonclient_venv`
makes it (the Makefile's `tritonclient` target); the tests skip, saying why, when it cannot be made.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

from rknn_client.user_cache import cache_root

VERSION = "2.73.0"
STAMP = "rknn-tritonclient.json"
INSTALL_TIMEOUT_S = 900


def venv_dir() -> Path:
    return cache_root() / f"tritonclient-{VERSION}-venv"


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def ensure() -> tuple[Path | None, str]:
    """The venv's interpreter, made if missing; else None and why it could not be made."""
    folder = venv_dir()
    if (folder / STAMP).is_file():
        return python_of(folder), ""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time; the others find its stamp
        if (folder / STAMP).is_file():
            return python_of(folder), ""
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(folder)],
            [
                str(python_of(folder)),
                "-m",
                "pip",
                "install",
                "--quiet",
                f"tritonclient[grpc,http]=={VERSION}",
            ],
        ]
        for step in steps:
            try:
                done = subprocess.run(
                    step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired:
                return (
                    None,
                    f"installing tritonclient {VERSION} took over {INSTALL_TIMEOUT_S} s (is PyPI reachable?)",
                )
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                return None, f"cannot install tritonclient {VERSION} (is PyPI reachable?): {' / '.join(tail)}"
        (folder / STAMP).write_text(json.dumps({"tritonclient": VERSION}))
    return python_of(folder), ""


def main() -> int:
    python, reason = ensure()
    print(
        f"tritonclient {VERSION}: {python}" if python else f"tritonclient: {reason}; tests/kserve will skip"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
