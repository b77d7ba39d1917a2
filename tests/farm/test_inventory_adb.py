"""The `adb` source: every board attached to adb becomes a farm device (through a private adb
server with emulated boards, see tests/adb)."""

from __future__ import annotations

from rknn_client.farm.inventory import parse_address
from tests.adb import conftest as adb_fixtures
from tests.adb.conftest import MakeBoard

# The adb fixtures, shared with tests/adb.
adb_server = adb_fixtures.adb_server
adb_env = adb_fixtures.adb_env
make_board = adb_fixtures.make_board


def test_adb_source_lists_every_attached_board(make_board: MakeBoard) -> None:
    boards = [make_board(f"farmboard{i}") for i in range(2)]
    entries = parse_address("adb")
    assert sorted((e.name, e.address) for e in entries) == sorted(
        (b.serial, f"adb:{b.serial}") for b in boards
    )
