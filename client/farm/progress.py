"""Progress of a fan-out: one tqdm bar per device on a terminal, plain `name: stage` lines elsewhere.

Devices run in parallel threads, so every write goes through one lock (tqdm's own for the bars):
lines never run together.
"""

from __future__ import annotations

import threading
from typing import IO, Any

from tqdm import tqdm

from rknn_client.farm.runner import STAGES, Timing


class FanoutProgress:
    """An Observer for run_fanout; `close()` when the run ends."""

    def __init__(
        self, names: list[str], timing: Timing, stream: IO[str], terminal: bool | None = None
    ) -> None:
        self.stream = stream
        self.terminal = stream.isatty() if terminal is None else terminal
        # Each stage is one step, "time" once per timed run.
        self.total = len(STAGES) - 1 + timing.runs
        self.runs = timing.runs
        self._timed: dict[str, int] = {}
        self._lock = threading.Lock()
        self._bars: dict[str, Any] = {}
        if self.terminal:
            width = max((len(n) for n in names), default=0)
            for position, name in enumerate(names):
                self._bars[name] = tqdm(
                    total=self.total,
                    desc=name.ljust(width),
                    position=position,
                    file=stream,
                    leave=True,
                    dynamic_ncols=True,
                    bar_format="{desc} {bar:30} {n_fmt}/{total_fmt} {elapsed} {postfix}",
                    postfix="waiting",
                )

    def __call__(self, name: str, stage: str) -> None:
        bar = self._bars.get(name)
        if bar is None:
            with self._lock:
                if stage == "time":
                    self._timed[name] = self._timed.get(name, 0) + 1
                    stage = f"time {self._timed[name]}/{self.runs}"
                print(f"{name}: {stage}", file=self.stream, flush=True)
            return
        if stage == "done":
            bar.update(self.total - bar.n)
        elif stage in ("failed", "cancelled"):
            bar.colour = "red"
        elif stage != STAGES[0]:
            bar.update(1)
        bar.set_postfix_str(stage)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
