"""--ready-file: once serving, the daemon says where it listens in a JSON file, and removes it on a clean stop."""

from __future__ import annotations

from pathlib import Path

from rknn_client import connect
from rknn_proto.ready import read_ready_file
from rknn_server.testing import start_daemon


def test_the_ready_file_names_the_bound_ports_and_this_run(tmp_path: Path) -> None:
    ready = tmp_path / "run" / "ready.json"
    daemon = start_daemon(
        tmp_path / "cache",
        tmp_path / "daemon.log",
        ["--runtime", "host", "--ready-file", str(ready), "--listen", "tcp://127.0.0.1:0"],
    )
    try:
        info = read_ready_file(ready)  # the `listening on` lines come after it: it is already there
        assert info.pid == daemon.pid
        # Two listeners on port 0: both bound ports are in the file, in --listen order.
        addresses = info.tcp_addresses()
        assert len(addresses) == 2 and addresses[0] == daemon.address
        assert all(not a.endswith(":0") for a in addresses)
        for address in addresses:
            with connect(f"tcp://{address}") as device:
                assert device.info().instance_id == info.instance_id
        assert not [p for p in ready.parent.iterdir() if p != ready], "a temporary file was left beside it"
    finally:
        assert daemon.stop() == 0
    assert not ready.exists()
