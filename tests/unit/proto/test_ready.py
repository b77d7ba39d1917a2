"""The `listening on` line and the ready file are parsed in one place (rknn_proto.ready)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rknn_proto.ready import (
    ReadyInfo,
    listening_line,
    read_ready_file,
    tcp_address,
    wait_tcp_address,
    write_ready_file,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (listening_line("tcp://127.0.0.1:50515") + "\n", "127.0.0.1:50515"),
        (listening_line("tcp://[::1]:7"), "[::1]:7"),
        (listening_line("unix-abstract:rknn_server"), None),
        ("metrics on http://127.0.0.1:9100/metrics", None),
        ("", None),
    ],
)
def test_tcp_address(line: str, expected: str | None) -> None:
    assert tcp_address(line) == expected


def test_the_ready_file_round_trips_and_replaces_an_older_one(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    path.write_text("{}")
    info = ReadyInfo(42, "1.2.3", "abcd", ["tcp://127.0.0.1:5000", "unix-abstract:x"], "http://h/metrics")
    write_ready_file(path, info)
    assert read_ready_file(path) == info
    assert info.tcp_addresses() == ["127.0.0.1:5000"]
    assert list(tmp_path.iterdir()) == [path]


def test_a_file_that_is_not_a_ready_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    path.write_text('{"pid": 1}')
    with pytest.raises(ValueError, match="not a rknn_server ready file"):
        read_ready_file(path)


def test_wait_tcp_address_takes_the_first_tcp_listener_and_stops_reading() -> None:
    read: list[str] = []

    def output() -> Iterator[str]:
        for line in (
            "starting\n",
            listening_line("unix-abstract:x") + "\n",
            listening_line("tcp://[::1]:7") + "\n",
        ):
            read.append(line)
            yield line
        raise AssertionError("read past the address")

    assert wait_tcp_address(output(), timeout_s=30) == "[::1]:7"
    assert len(read) == 3


def test_wait_tcp_address_gives_up_on_a_silent_daemon() -> None:
    release = threading.Event()

    def silent() -> Iterator[str]:
        release.wait(30)  # a daemon that prints nothing (the pipe blocks)
        yield listening_line("tcp://127.0.0.1:1")

    try:
        assert wait_tcp_address(silent(), timeout_s=0.2) is None
    finally:
        release.set()
