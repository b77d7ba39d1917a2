"""CPU seconds and RSS of a server's whole process tree: PyTriton serves from tritonserver (its
child) and Python stubs (the child's children), MLServer from a worker process; every server is
measured with its children included, ours too."""

from __future__ import annotations

import threading
from types import TracebackType

import psutil


class ProcessTree:
    """A server's process and its descendants, looked up afresh at each reading."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self._last_cpu: dict[int, float] = {}  # a process that exits keeps what it spent

    def processes(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """User + system CPU of every process of the tree so far (its threads included)."""
        for process in self.processes():
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            self._last_cpu[process.pid] = times.user + times.system
        return sum(self._last_cpu.values())

    def rss_bytes(self) -> int:
        """The sum of the tree's RSS (pages shared between its processes count in each)."""
        total = 0
        for process in self.processes():
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total


class PeakRss:
    """The tree's largest RSS while the block runs, sampled every 50 ms."""

    def __init__(self, tree: ProcessTree, interval_s: float = 0.05) -> None:
        self.tree, self.interval_s, self.peak = tree, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.tree.rss_bytes())
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.tree.rss_bytes())
