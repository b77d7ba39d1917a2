"""`rknn-client farm check`: the normalized inventory, every problem named, every device reached."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from rknn_server.testing import DaemonProcess
from tests.farm.conftest import SOCS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def farm_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rknn_client.cli", "farm", "check", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
    )


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_good_inventory_is_printed_normalized_and_every_device_answers(
    tmp_path: Path, boards: list[DaemonProcess]
) -> None:
    (tmp_path / "farm.token").write_text("t0ken\n")
    farm = tmp_path / "farm.toml"
    farm.write_text(
        f"""
[defaults]
labels = {{ rack = "r1" }}
auth = {{ token_file = "farm.token" }}

[[device]]
name = "big"
address = "{boards[0].url}"
labels = {{ soc = "RK3588" }}

[[device]]
address = "{boards[1].url}"
auth = {{ token = "literal-secret" }}
"""
    )
    run = farm_check(str(farm))
    assert run.returncode == 0, run.stderr
    assert "literal-secret" not in run.stdout
    devices = tomllib.loads(run.stdout)["device"]  # stdout is the normalized inventory alone
    second = boards[1].url.removeprefix("tcp://")
    assert devices == [
        {
            "name": "big",
            "address": boards[0].url,
            "labels": {"rack": "r1", "soc": "rk3588"},
            "auth": {"token_file": str(tmp_path / "farm.token")},
        },
        {"name": second, "address": boards[1].url, "labels": {"rack": "r1"}, "auth": {"token": "<hidden>"}},
    ]
    *table, verdict = run.stderr.splitlines()
    rows = [line.split() for line in table]
    assert rows[0] == ["name", "address", "health", "soc", "daemon", "protocol", "result"]
    assert [(r[0], r[2], r[3], r[-1]) for r in rows[1:]] == [
        ("big", "SERVING", SOCS[0], "ok"),
        (second, "SERVING", SOCS[1], "ok"),
    ]
    assert verdict == "ok: 2 device(s), all reachable"


def test_every_problem_is_reported_and_the_good_devices_still_reached(
    tmp_path: Path, boards: list[DaemonProcess]
) -> None:
    dead = closed_port()
    farm = tmp_path / "farm.toml"
    farm.write_text(
        f"""
[[device]]
name = "good"
address = "{boards[0].url}"

[[device]]
name = "mislabelled"
address = "{boards[1].url}"
labels = {{ soc = "rk3588" }}

[[device]]
name = "unplugged"
address = "tcp://{dead}"

[[device]]
name = "typo"
address = "tcp://{dead}"
colour = "red"

[[device]]
name = "good"
address = "{boards[2].url}"

[[device]]
name = "badport"
address = "tcp://10.0.0.1:99999"

[[device]]
name = "locked"
address = "{boards[2].url}"
auth = {{ token_file = "missing.token" }}
"""
    )
    started = time.monotonic()
    run = farm_check(str(farm))
    assert time.monotonic() - started < 60
    assert run.returncode == 1
    problems = [
        line.removeprefix("problem: ") for line in run.stderr.splitlines() if line.startswith("problem: ")
    ]
    expected = [
        "device #4: unknown key(s) ['colour']",
        "device #6: 'tcp://10.0.0.1:99999' has an invalid port",
        "two devices are named 'good'",
        "locked: cannot read the token file",
        "unplugged: unreachable: ",
        "mislabelled: labelled soc = 'rk3588' but the board reports 'rk3566'",
    ]
    assert len(problems) == len(expected), run.stderr
    for wanted in expected:
        assert sum(wanted in p for p in problems) == 1, (wanted, problems)
    assert "Connection refused" in next(p for p in problems if p.startswith("unplugged"))
    assert run.stderr.splitlines()[-1] == f"{len(expected)} problem(s)"
    rows = {
        line.split()[0]: line.split() for line in run.stderr.splitlines() if not line.startswith("problem")
    }
    assert rows["good"][2] == "SERVING" and rows["unplugged"][2] == "DOWN"


def test_json_output(boards: list[DaemonProcess]) -> None:
    dead = closed_port()
    run = farm_check("--devices", f"{boards[0].url},tcp://{dead}", "--json")
    assert run.returncode == 1
    data = json.loads(run.stdout)
    assert data["ok"] is False
    assert [(d["name"], d["reachable"]) for d in data["devices"]] == [
        (boards[0].url.removeprefix("tcp://"), True),
        (dead, False),
    ]
    assert data["devices"][0]["soc"] == SOCS[0] and data["devices"][0]["protocol_version"] > 0
    assert len(data["problems"]) == 1 and data["problems"][0].startswith(f"{dead}: unreachable")
