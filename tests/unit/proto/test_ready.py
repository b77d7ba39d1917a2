"""The `listening on` line and the ready file are parsed in one place (rknn_proto.ready)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rknn_proto.ready import ReadyInfo, listening_line, read_ready_file, tcp_address, write_ready_file


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
