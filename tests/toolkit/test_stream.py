"""The worker's output streams: forwarded as they arrive, sync markers stripped and counted."""

from __future__ import annotations

import io
import os
import threading

from rknn_client.toolkit.bridge import SYNC, _Stream


class _Sink(io.StringIO):
    """Records each write and signals it, so the test waits on events instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self.wrote.set()
        return n


def test_partial_output_is_forwarded_before_the_line_ends_and_markers_are_hidden() -> None:
    read_fd, write_fd = os.pipe()
    sink = _Sink()
    with os.fdopen(read_fd, "rb") as pipe:
        stream = _Stream("stdout", pipe, lambda: sink)
        os.write(write_fd, b"I Loading :   0%\r")
        assert sink.wrote.wait(10) and sink.getvalue() == "I Loading :   0%\r"
        sink.wrote.clear()
        os.write(write_fd, b"progress 50%")  # no line end yet: still shown now
        assert sink.wrote.wait(10) and sink.getvalue().endswith("progress 50%")
        os.write(write_fd, b"\ndone\n" + SYNC.encode()[:5])  # a marker split across two writes
        os.write(write_fd, SYNC.encode()[5:] + b" 3\nafter\n")
        assert stream.take_lines(3, timeout=10) == ["I Loading :   0%", "progress 50%", "done"]
        os.close(write_fd)
        stream.thread.join(10)
    assert sink.getvalue() == "I Loading :   0%\rprogress 50%\ndone\nafter\n"
    assert stream.take_lines(None, timeout=10) == ["after"]
