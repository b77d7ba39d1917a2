"""The run's guards: an image build that overruns its deadline fails naming the step, and a machine that
cannot reach the package index is told so (board-test then skips) instead of failing half-way."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.board.preflight import unreachable
from tests.board.rootfs import BOARDS, Deadline, logged


def test_a_step_past_the_deadline_is_stopped_and_named(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"building the arm64 image passed its 1 s deadline while sleeping"
    ):
        logged(["sleep", "30"], tmp_path / "log", Deadline("arm64", 1), "sleeping")
    assert time.monotonic() - started < 10


def test_a_failing_step_names_itself_and_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=rf"failing failed \(exit 3\); its output is in {tmp_path}/log"):
        logged(["sh", "-c", "echo why; exit 3"], tmp_path / "log", Deadline("arm64", 60), "failing")
    assert (tmp_path / "log").read_text() == "why\n"


def test_an_index_that_does_not_answer_is_the_reason_to_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", url)
    assert unreachable([BOARDS["arm64"]]).startswith(f"cannot reach {url}/pip/ (")
