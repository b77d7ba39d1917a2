"""Progress bars for long work on a terminal (tqdm), silent when stderr is not one.

One bar per job, in bytes throughout: an upload first shows the model being hashed, then sent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

Update = Callable[[int, int], None]


class ByteBar:
    """A tqdm bar in bytes whose description names the phase (`hashing`, `upload`, ...)."""

    def __init__(self, bar: tqdm) -> None:
        self._bar = bar
        self._phase = ""

    def phase(self, name: str) -> Update:
        """A (done, total) callback that shows `name` while it reports."""

        def update(done: int, total: int) -> None:
            if name != self._phase:
                self._phase = name
                self._bar.set_description_str(name, refresh=False)
            self._bar.total = total or None  # 0: not known yet
            self._bar.n = done
            self._bar.refresh()

        return update


@contextmanager
def byte_bar(enabled: bool, desc: str, delay_s: float = 0.0) -> Iterator[ByteBar | None]:
    """A ByteBar when `enabled` and stderr is a terminal, else None; closed (and erased) at the end.
    With `delay_s` the bar appears only when the work lasts that long (small transfers show none)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bar = tqdm(
        unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=False, file=sys.stderr, delay=delay_s
    )
    try:
        yield ByteBar(bar)
    finally:
        bar.close()
