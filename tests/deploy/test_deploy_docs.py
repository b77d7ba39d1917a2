"""docs/deploy.md: covers every board the toolkit can connect to, and shows the command the units start."""

from __future__ import annotations

import shlex

from deploy_files import BOARD_ARGS, REPO, normalise_board_args

DOC = REPO / "docs" / "deploy.md"
# The toolkit's connected-mode targets (RK2118's rknn_server is a different service).
CONNECTED_TARGETS = [
    "RV1103",
    "RV1103B",
    "RV1106",
    "RV1106B",
    "RV1126B",
    "RK3562",
    "RK3566",
    "RK3568",
    "RK3576",
    "RK3588",
]


def test_per_soc_table_covers_every_connected_target() -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| R")]
    socs = {soc.strip() for row in rows for soc in row.split("|")[1].split(",")}
    assert set(CONNECTED_TARGETS) <= socs


def test_documented_command_is_the_units_command() -> None:
    text = DOC.read_text()
    block = text.split("```\n", 2)[1]
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[0] == "rknn_server"
    assert normalise_board_args(argv[1:]) == BOARD_ARGS
