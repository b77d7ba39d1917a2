"""Progress of parallel boards: a bar of its own per board on a terminal, whole lines elsewhere."""

from __future__ import annotations

import io
import re
import threading

from rknn_client.farm.progress import FanoutProgress
from rknn_client.farm.runner import STAGES, Timing

NAMES = ["rk3588-a", "rk3566-b", "rv1106-c"]
TIMING = Timing(warmup=1, runs=4)


def drive(progress: FanoutProgress) -> None:
    """Every board walks through its stages at once, from its own thread, as run_fanout's workers do."""
    start = threading.Barrier(len(NAMES))

    def walk(name: str) -> None:
        start.wait()
        for stage in STAGES:
            for _ in range(TIMING.runs if stage == "time" else 1):
                progress(name, stage)
        progress(name, "failed" if name == NAMES[2] else "done")

    threads = [threading.Thread(target=walk, args=(name,)) for name in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    progress.close()


def test_off_a_terminal_each_step_is_one_whole_line() -> None:
    out = io.StringIO()
    drive(FanoutProgress(NAMES, TIMING, out))
    lines = out.getvalue().splitlines()
    assert all(re.fullmatch(r"[a-z0-9-]+: [a-z0-9/ -]+", line) for line in lines), lines
    for name in NAMES:
        mine = [line.removeprefix(f"{name}: ") for line in lines if line.startswith(f"{name}: ")]
        assert mine == [
            "reserve", "load", "run", "warm-up", "time 1/4", "time 2/4", "time 3/4", "time 4/4", "perf",
            "memory", "failed" if name == NAMES[2] else "done",
        ]  # fmt: skip


def test_on_a_terminal_each_board_has_its_own_bar() -> None:
    out = io.StringIO()
    progress = FanoutProgress(NAMES, TIMING, out, terminal=True)
    drive(progress)
    total = progress.total
    text = out.getvalue()
    assert "\x1b[A" in text  # the bars are redrawn in place, one terminal line each
    for name in NAMES[:2]:
        assert re.search(rf"{name} .*\b{total}/{total}\b.*done", text), name
    assert re.search(rf"{NAMES[2]} .*\b{total - 1}/{total}\b.*failed", text)
