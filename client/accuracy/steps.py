"""What an accuracy analysis is doing, shown while it does it, and what it left on disk afterwards.

Each step (running a model, the single-layer runs, comparing, writing a side's tensors) is a tqdm bar
on stderr that appears only once the step has lasted `delay_s` (about 2 s), so a small model prints
nothing extra and a large one never sits silent. Bars are drawn only on a terminal (a log file would
fill with carriage returns) unless `enabled` says otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

DELAY_S = 2.0
Advance = Callable[[int], None]


class Steps:
    """Progress bars for the steps of one analysis; `Steps.quiet()` shows none."""

    def __init__(
        self, stream: TextIO | None = None, delay_s: float = DELAY_S, enabled: bool | None = None
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._delay_s = delay_s
        self._enabled = self._stream.isatty() if enabled is None else enabled

    @classmethod
    def quiet(cls) -> Steps:
        return cls(enabled=False)

    @contextmanager
    def step(self, desc: str, total: int, unit: str = "layer") -> Iterator[Advance]:
        """A bar for `total` items; the caller advances it by the items it finished."""
        if not self._enabled:
            yield lambda _done: None
            return
        bar = tqdm(total=total, desc=desc, unit=unit, file=self._stream, delay=self._delay_s, leave=True)
        try:
            yield bar.update
        finally:
            bar.close()


@dataclass(frozen=True)
class Written:
    """The files an analysis wrote under its output folder, and their size."""

    files: int = 0
    bytes: int = 0

    @classmethod
    def of(cls, *paths: Path) -> Written:
        return cls(len(paths), sum(path.stat().st_size for path in paths))

    def __add__(self, other: Written) -> Written:
        return Written(self.files + other.files, self.bytes + other.bytes)

    def text(self, folder: Path) -> str:
        return f"wrote {self.files} files ({self.bytes / 1e6:.1f} MB) under {folder}"
