"""The rooms and their doors: who may import whom, and what a board-side install pulls in."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11, boards may not
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# tomli is not here: the daemon reads `--config rknn_server.toml` with it on Python 3.10 (pure Python).
PC_ONLY = {"adbutils", "onnxruntime", "onnx", "jinja2", "plotly", "pillow", "tqdm"}


def imported_modules(folder: Path) -> dict[Path, set[str]]:
    found: dict[Path, set[str]] = {}
    for path in folder.rglob("*.py"):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[path] = names
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, names in imported_modules(ROOT / folder).items()
        for name in sorted(names)
        if name.split(".")[0] in forbidden or name.startswith(forbidden)
    ]


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("server", ("rknn_client",)),
        ("client", ("rknn_server",)),
        ("proto", ("rknn_server", "rknn_client")),
        (
            "server/runtime",
            (
                "grpc",
                "google.protobuf",
                "rknn_proto.rknn_pb2",
                "rknn_server.service",
                "rknn_server.daemon",
                "rknn_server.sessions",
            ),
        ),
    ],
)
def test_rooms_import_only_what_the_architecture_allows(folder: str, forbidden: tuple[str, ...]) -> None:
    assert offenders(folder, forbidden) == []


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        # The handlers translate protobuf over the data plane: which backend serves is not their business.
        (
            "server/service.py",
            (
                "rknn_server.runtime.host",
                "rknn_server.runtime.rknnrt",
                "rknn_server.runtime.isolated",
                "rknn_server.runtime.select",
                "rknn_server.runtime.backend_hook",
            ),
        ),
        (
            "server/pipeline.py",
            (
                "rknn_server.runtime.host",
                "rknn_server.runtime.rknnrt",
                "rknn_server.runtime.isolated",
                "rknn_server.runtime.select",
                "rknn_server.runtime.backend_hook",
            ),
        ),
        # The data plane knows no protocol, so a second one (a legacy listener, KServe v2) can call it.
        (
            "server/data_plane.py",
            (
                "grpc",
                "rknn_proto.rknn_pb2",
                "rknn_proto.rknn_pb2_grpc",
                "rknn_server.service",
                "rknn_server.frames",
                "rknn_server.pipeline",
            ),
        ),
        # The plain messages: what runtimes and the data plane use, without protobuf.
        ("proto/messages.py", ("grpc", "google.protobuf", "rknn_proto.rknn_pb2", "rknn_proto.rknn_pb2_grpc")),
    ],
)
def test_a_module_imports_only_what_its_room_allows(module: str, forbidden: tuple[str, ...]) -> None:
    path = ROOT / module
    names = imported_modules(path.parent)[path]
    # `from rknn_proto import rknn_pb2` names the package: count the names imported from it too.
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    bad = sorted(n for n in names if n.split(".")[0] in forbidden or n.startswith(forbidden))
    assert bad == []


def test_a_board_install_pulls_in_nothing_pc_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    board = [*project["dependencies"], *project["optional-dependencies"]["server"]]
    names = {
        req.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
        for req in board
    }
    assert not names & PC_ONLY, names & PC_ONLY
    uvloop = next(req for req in board if req.startswith("uvloop"))
    assert "armv7l" in uvloop, "uvloop has no armv7 wheels: it must be optional there"
