"""The bench's side of a driver process: send it a job, read the server's CPU and RSS around the
measured window only (after the driver says it is warm, until it answers), and turn the latencies
into figures. A driver that fails or hangs gives a reason, never an exception."""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.proctree import PeakRss, ProcessTree

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WARM_TIMEOUT_S = 180.0  # connecting, loading (rknn.v1 uploads the model) and the warm-up calls
ANSWER_SLACK_S = 120.0


@dataclass(frozen=True)
class Figures:
    requests: int
    p50_ms: float
    p99_ms: float
    throughput_rps: float
    server_cpu_s_per_1000_requests: float  # = server CPU ms per request
    server_rss_peak_mib: float

    @classmethod
    def of(cls, latencies: list[float], wall_s: float, cpu_s: float, rss: int) -> Figures:
        ordered = sorted(latencies)
        return cls(
            requests=len(ordered),
            p50_ms=statistics.median(ordered) * 1e3,
            p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
            throughput_rps=len(ordered) / wall_s,
            server_cpu_s_per_1000_requests=cpu_s / len(ordered) * 1000,
            server_rss_peak_mib=rss / 2**20,
        )


def driver_env() -> dict[str, str]:
    """PYTHONPATH reaches bench.peers.load_loop; RKNN_SHM=off keeps rknn.v1 on the wire."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "RKNN_SHM": "off"}


class Driver:
    """A driver process (drive_v2.py in the tritonclient venv, or drive_rknn.py in ours)."""

    def __init__(self, python: Path, script: str, log: Path) -> None:
        self.log = log.open("a")
        self.process = subprocess.Popen(
            [str(python), str(HERE / script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=driver_env(),
            cwd=ROOT,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")  # it ended

    def _send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            return {"errors": [f"the driver gave no answer in {timeout_s:.0f} s"]}
        if not line:
            return {"errors": [f"the driver exited (exit status {self.process.poll()}; see {self.log.name})"]}
        return dict(json.loads(line))

    def measure(self, job: dict[str, Any], tree: ProcessTree) -> Figures | str:
        """The job's figures, or why there are none."""
        try:
            self._send(json.dumps(job))
        except OSError as exc:
            return f"the driver is gone: {exc}"
        warm = self._answer(WARM_TIMEOUT_S)
        if not warm.get("warm"):
            return "; ".join(warm.get("errors") or ["no warm-up"])[:600]
        before = tree.cpu_seconds()
        with PeakRss(tree) as rss:
            self._send("go")
            done = self._answer(float(job["seconds"]) + ANSWER_SLACK_S)
        cpu_s = tree.cpu_seconds() - before
        if done.get("errors") or not done.get("latencies_s"):
            return "; ".join(done.get("errors") or ["no request answered"])[:600]
        return Figures.of(done["latencies_s"], done["wall_s"], cpu_s, rss.peak)

    def close(self) -> None:
        """End its stdin (it exits after its last job), else kill it by PID."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.log.close()
