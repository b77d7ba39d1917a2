"""The labgrid lab of the farm tests' modules (each module that imports these has its own): three
boards on two exporters ("hosts"), places tagged with what the boards report.

host-a publishes b0 (rk3588) and b2 (rk3566), daemons over TCP (RKNNDaemon); host-b publishes b1
(rk3588), a board on host-b's adb (the adbd emulator, on a private adb server of host-b's): host-b
forwards its daemon's socket to a TCP port (`adb forward tcp:0 localabstract:rknn_server`) and
publishes the serial with that port (RKNNAdbDaemon).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from rknn_client.farm.inventory import DeviceEntry, tcp_address
from rknn_client.farm.probe import DeviceStatus, probe
from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET
from rknn_server.testing import start_daemon
from tests.adb.host_board import adb_host_board
from tests.farm import labgrid_lab
from tests.farm.labgrid_lab import Lab, Resource

SOCS = {"b0": "rk3588", "b1": "rk3588", "b2": "rk3566"}
HOSTS = {"b0": "host-a", "b1": "host-b", "b2": "host-a"}
ADB_BOARD = "b1"


@dataclass(frozen=True)
class Board:
    """A board as its host exports it: the resource, and where the PC reaches its daemon."""

    resource: Resource
    entry: DeviceEntry

    def status(self) -> DeviceStatus:
        return probe(self.entry)


def facts(status: DeviceStatus) -> dict[str, str]:
    """The tags an admin gives a board's place: what `rknn-client farm check` reads from it (the
    runtime's version number alone, as an admin would write it)."""
    assert status.healthy, status.error
    return {
        "soc": status.reported_soc,
        "runtime": status.runtime,
        "runtime_version": status.runtime_version.split()[-1],
        "daemon_version": status.daemon_version,
    }


@pytest.fixture(scope="module")
def boards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Board]]:
    """The three boards, shared by the tests of a module as its lab is (each test gives back what it
    held); every process they need is stopped by PID at the end."""
    root = tmp_path_factory.mktemp("labgrid-boards")
    with contextlib.ExitStack() as stack:

        def tcp_board(name: str) -> Board:
            args = ["--runtime", "host", "--soc", SOCS[name]]
            daemon = start_daemon(root / f"{name}-cache", root / f"{name}.log", args)
            stack.callback(daemon.stop)
            port = int(daemon.address.rsplit(":", 1)[1])
            return Board(
                Resource("RKNNDaemon", {"address": "127.0.0.1", "port": port}), DeviceEntry(name, daemon.url)
            )

        with ThreadPoolExecutor(2) as pool:
            started = dict(zip(("b0", "b2"), pool.map(tcp_board, ("b0", "b2")), strict=True))
        adb = stack.enter_context(adb_host_board(root / ADB_BOARD, SOCS[ADB_BOARD]))
        forwarded = adb.server.adb(
            "-s", adb.serial, "forward", "tcp:0", f"localabstract:{DEFAULT_ABSTRACT_SOCKET}"
        )
        port = int(forwarded.stdout.strip())
        params = {"serial": adb.serial, "address": "127.0.0.1", "port": port}
        started[ADB_BOARD] = Board(
            Resource("RKNNAdbDaemon", params), DeviceEntry(ADB_BOARD, tcp_address("127.0.0.1", port))
        )
        yield dict(sorted(started.items()))


@pytest.fixture(scope="module")
def lab(boards: dict[str, Board], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The lab, with labgrid-client on PATH (as `pipx install labgrid` puts it) and no LG_* variable
    of the machine's in the way; each place tagged with its board's facts and rack=r1."""
    bin_dir, reason = labgrid_lab.ensure()
    if bin_dir is None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("labgrid-lab")
    (root / "path").mkdir()
    (root / "path" / "labgrid-client").symlink_to(bin_dir / "labgrid-client")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("LG_COORDINATOR", "LG_PLACE", "LG_TOKEN", "LG_ENV"):
            patch.delenv(name, raising=False)
        patch.setenv("PATH", f"{root / 'path'}{os.pathsep}{os.environ['PATH']}")
        lab = Lab(bin_dir, root)
        try:
            exporters: dict[str, dict[str, Resource]] = {}
            for name, board in boards.items():
                exporters.setdefault(HOSTS[name], {})[name] = board.resource
            lab.add_exporters(exporters)
            lab.add_places({name: {**facts(b.status()), "rack": "r1"} for name, b in boards.items()})
            yield lab
        finally:
            lab.stop()
