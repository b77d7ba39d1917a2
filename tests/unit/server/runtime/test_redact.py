"""Server paths never reach a client in an error's text; the client keeps the file names it knows."""

from __future__ import annotations

import grpc
import pytest

from rknn_server.errors import status_of
from rknn_server.runtime.base import ExecutionError
from rknn_server.runtime.redact import without_paths


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Load model from /var/cache/rknn/models/ab12/m.onnx failed", "Load model from m.onnx failed"),
        ('path does not exist: "/srv/cwd/etc/shadow"', 'path does not exist: "shadow"'),
        (
            "listening on tcp://127.0.0.1:5000, unix:/run/rknn.sock",
            "listening on tcp://127.0.0.1:5000, unix:/run/rknn.sock",
        ),
        ("shape (1/2) a / b", "shape (1/2) a / b"),
    ],
)
def test_absolute_paths_are_cut_to_their_last_component(text: str, expected: str) -> None:
    assert without_paths(text) == expected


def test_an_unexpected_error_travels_without_the_server_path() -> None:
    code, message = status_of(
        FileNotFoundError(2, "No such file or directory", "/srv/rknn/cache/models/ab/m.onnx")
    )
    assert code == grpc.StatusCode.INTERNAL
    assert "reference" in message and "/srv" not in message and "m.onnx" not in message


def test_a_runtime_error_travels_without_the_server_path() -> None:
    code, message = status_of(ExecutionError("Load model from /var/cache/rknn/models/ab12/m.onnx failed"))
    assert code == grpc.StatusCode.INTERNAL
    assert message == "Load model from m.onnx failed"
