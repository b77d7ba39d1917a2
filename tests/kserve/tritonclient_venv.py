"""The venvs with Triton's real clients that the KServe v2 wire tests drive the daemon with.

`tritonclient` pins its own protobuf and grpcio, so it never shares the project's interpreter: it
lives in a venv of its own in the user's cache folder (like the toolkit's), made once and reused; a
venv without the stamp (an interrupted install) is made again. `perf_analyzer` gets one too: its
current wheels (`perf-analyzer`) need glibc 2.38, so it comes from the last `tritonclient` wheel that
ships the binary and runs on older systems (Debian 12's glibc 2.36), with the CUDA runtime library it
links (`nvidia-cuda-runtime-cu12`; no GPU is used) and libb64 (the system's `libb64-0d`, which the
Makefile installs with apt-get when run as root). `python -m tests.kserve.tritonclient_venv` makes
both (the Makefile's `tritonclient` target); the tests skip, saying why, when one cannot be made.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rknn_client.user_cache import cache_root

RUN_TIMEOUT_S = 300  # one perf_analyzer run

VERSION = "2.73.0"
PERF_ANALYZER_WHEEL = "2.41.1"  # the tritonclient wheel whose bin/perf_analyzer runs on glibc 2.34+
CUDA_RUNTIME = "12.9.79"
STAMP = "rknn-tritonclient.json"
INSTALL_TIMEOUT_S = 900


def venv_dir() -> Path:
    return cache_root() / f"tritonclient-{VERSION}-venv"


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def make_venv(folder: Path, requirements: list[str]) -> str:
    """Make `folder` a venv with `requirements` (pip arguments) unless its stamp says it is; "" or why not."""
    if (folder / STAMP).is_file():
        return ""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time; the others find its stamp
        if (folder / STAMP).is_file():
            return ""
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(folder)],
            [str(python_of(folder)), "-m", "pip", "install", "--quiet", *requirements],
        ]
        for step in steps:
            try:
                done = subprocess.run(
                    step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired:
                return f"installing {' '.join(requirements)} took over {INSTALL_TIMEOUT_S} s (is PyPI reachable?)"
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                return f"cannot install {' '.join(requirements)} (is PyPI reachable?): {' / '.join(tail)}"
        (folder / STAMP).write_text(json.dumps({"requirements": requirements}))
    return ""


def ensure() -> tuple[Path | None, str]:
    """The tritonclient venv's interpreter, made if missing; else None and why it could not be made."""
    folder = venv_dir()
    reason = make_venv(folder, [f"tritonclient[grpc,http]=={VERSION}"])
    return (None, reason) if reason else (python_of(folder), "")


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    env: dict[str, str]  # the environment it runs in (the CUDA runtime library on its path)

    def measure(self, report: Path, *args: str, interval_ms: int = 500) -> list[dict[str, str]]:
        """The rows of its CSV report for one run with `args` (it must succeed). Any three windows
        count as stable (a busy machine's latency varies), so it always ends."""
        done = subprocess.run(
            [
                str(self.binary),
                *args,
                *("--measurement-interval", str(interval_ms), "--stability-percentage", "1000"),
                *("--max-trials", "3", "-f", str(report)),
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        with report.open(newline="") as rows:
            return list(csv.DictReader(rows))


def ensure_perf_analyzer() -> tuple[PerfAnalyzer | None, str]:
    """perf_analyzer, installed if missing and checked to start here; else None and why not."""
    folder = cache_root() / f"perf-analyzer-{PERF_ANALYZER_WHEEL}-venv"
    reason = make_venv(
        folder,
        [
            "--no-deps",  # only the binary is used, not the Python package around it
            f"tritonclient=={PERF_ANALYZER_WHEEL}",
            f"nvidia-cuda-runtime-cu12=={CUDA_RUNTIME}",
        ],
    )
    if reason:
        return None, reason
    found = sorted(folder.glob("lib/python*/site-packages/nvidia/cuda_runtime/lib"))
    library_path = ":".join([*map(str, found), os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    tool = PerfAnalyzer(folder / "bin" / "perf_analyzer", {**os.environ, "LD_LIBRARY_PATH": library_path})
    try:
        done = subprocess.run(
            [str(tool.binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=tool.env,
        )
    except OSError as exc:
        return None, f"perf_analyzer cannot start on this platform: {exc}"
    if "Perf Analyzer Version" not in done.stdout + done.stderr:  # (it prints it and exits 1)
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return None, f"perf_analyzer cannot run here ({why[0]}); on Debian/Ubuntu: apt-get install libb64-0d"
    return tool, ""


def main() -> int:
    python, reason = ensure()
    print(
        f"tritonclient {VERSION}: {python}" if python else f"tritonclient: {reason}; tests/kserve will skip"
    )
    tool, reason = ensure_perf_analyzer()
    print(
        f"perf_analyzer (tritonclient {PERF_ANALYZER_WHEEL}): {tool.binary}"
        if tool
        else f"perf_analyzer: {reason}; its test will skip"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
