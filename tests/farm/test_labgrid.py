"""`rknn-client farm run --labgrid` and `farm check --labgrid` on a real labgrid lab: places chosen by
tag (an adb-attached board's too), held one run at a time and the higher priority first, shown by
`labgrid-client who`, named with their hosts in the report, and given back when a run is interrupted
or killed."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rknn_client.farm import Farm, Lease
from rknn_client.farm.labgrid_farm import labgrid_python
from rknn_client.farm.probe import probe
from tests.cli_run import CliRun, cli
from tests.farm.labgrid_fixtures import ADB_BOARD, Board, boards, facts, lab
from tests.farm.labgrid_lab import Lab, wait_until

__all__ = ["boards", "lab"]  # the module's lab, used as fixtures


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "input.npy"
    np.save(path, np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32))
    return path


@pytest.fixture
def b2_hog(boards: dict[str, Board]) -> Iterator[Lease]:
    """b2's daemon reserved outside labgrid: a run holding place b2 then waits in the daemon's queue,
    holding the place without the CPU a running model would take."""
    lease = Farm([boards["b2"].entry]).acquire(timeout=30, holder="hog")
    try:
        yield lease
    finally:
        lease.release()


def rk3566_run(model: Path, image: Path, *args: str) -> CliRun:
    """A run on the rk3566 place, b2, in the background (b2 its own reference: no host daemon to start)."""
    return CliRun(
        ["farm", "run", str(model), "--input", str(image), "--soc", "rk3566", "--reference", "device:b2",
         "--runs", "1", *args]
    )  # fmt: skip


def stopped(runs: list[CliRun]) -> None:
    for run in runs:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


@pytest.mark.parametrize(
    "script",
    ["#!/opt/lg/bin/python\n", '#!/bin/sh\n\'\'\'exec\' "/opt/lg/bin/python" "$0" "$@"\n'],
    ids=["shebang", "pip-long-path"],
)
def test_the_agent_runs_on_the_python_of_labgrid_client(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "labgrid-client").write_text(script)
    (tmp_path / "labgrid-client").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert labgrid_python() == "/opt/lg/bin/python"


def test_farm_run_runs_on_exactly_the_places_of_the_tag(
    lab: Lab, cnn_model: Path, image: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    done = cli(
        "farm", "run", str(cnn_model), "--input", str(image), "--labgrid", lab.address, "--soc", "rk3588",
        "--runs", "2", "--json", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    devices = {d["name"]: d for d in json.loads(report.read_text())["devices"]}
    assert sorted(devices) == ["b0", "b1"]  # b1 is the board on host-b's adb
    assert all(d["ok"] and d["agrees"] and d["soc"] == "rk3588" for d in devices.values())
    assert {(d["place"], d["host"]) for d in devices.values()} == {("b0", "host-a"), ("b1", "host-b")}
    assert devices["b0"]["labels"]["rack"] == "r1" and devices["b1"]["labels"]["runtime"] == "host"
    assert "b0 @ host-a" in done.stdout and "b1 @ host-b" in done.stdout  # the table names them too
    assert lab.acquired() == {}
    assert lab.reservation_states() == []


def test_a_second_run_waits_until_the_first_gives_the_place_back(
    lab: Lab,
    boards: dict[str, Board],
    b2_hog: Lease,
    cnn_model: Path,
    image: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b2 = boards["b2"].entry
    first = rk3566_run(cnn_model, image, "--labgrid", lab.address)
    runs = [first]
    try:
        wait_until(lambda: probe(b2).reservation_waiters == 1, "the first run queued at b2's daemon")
        assert list(lab.acquired()) == ["b2"]  # `labgrid-client who` shows the place the run holds
        monkeypatch.setenv("LG_COORDINATOR", lab.address)  # labgrid's own variable instead of --labgrid
        second = rk3566_run(cnn_model, image)
        runs.append(second)
        wait_until(lambda: lab.reservation_states() == ["acquired", "waiting"], "the second run queued")
        assert probe(b2).reservation_waiters == 1  # the second is not at the daemon: labgrid holds it back
        first.process.send_signal(signal.SIGINT)
        code, _, stderr = first.finish()
        assert code == 130, stderr[-3000:]
        wait_until(lambda: probe(b2).reservation_waiters == 1, "the second run queued at b2's daemon")
        assert list(lab.acquired()) == ["b2"]
        b2_hog.release()
        code, stdout, stderr = second.finish()
        assert code == 0, stderr[-3000:]
        assert "b2" in stdout
    finally:
        stopped(runs)
    assert lab.acquired() == {}
    assert lab.reservation_states() == []


def test_a_killed_run_gives_its_place_back(
    lab: Lab, boards: dict[str, Board], b2_hog: Lease, cnn_model: Path, image: Path
) -> None:
    # Labgrid keeps a lock after its client is gone (labgrid-client exits right after acquiring) ...
    lab.client("-p", "b0", "acquire")
    assert "b0" in lab.acquired()
    lab.client("-p", "b0", "release")
    # ... so a killed run's place is given back by its agent, which sees the run end.
    b2 = boards["b2"].entry
    run = rk3566_run(cnn_model, image, "--labgrid", lab.address)
    try:
        wait_until(lambda: probe(b2).reservation_waiters == 1, "the run queued at b2's daemon")
        assert list(lab.acquired()) == ["b2"]
        run.process.kill()
        run.process.wait()
    finally:
        stopped([run])
    wait_until(lambda: lab.acquired() == {}, "the killed run's place unlocked")
    wait_until(lambda: lab.reservation_states() == [], "the killed run's reservation cancelled")


def test_of_two_waiting_runs_the_higher_priority_gets_the_place_first(
    lab: Lab, boards: dict[str, Board], b2_hog: Lease, cnn_model: Path, image: Path
) -> None:
    lab.client("-p", "b2", "acquire")  # someone holds b2 while both runs queue for it
    runs: list[CliRun] = []
    try:
        runs.append(rk3566_run(cnn_model, image, "--labgrid", lab.address))  # the older one ...
        wait_until(lambda: lab.reservation_states() == ["waiting"], "the default-priority run queued")
        runs.append(rk3566_run(cnn_model, image, "--labgrid", lab.address, "--priority", "10"))
        wait_until(lambda: lab.reservation_states() == ["waiting", "waiting"], "the priority run queued")
        lab.client("-p", "b2", "release")
        wait_until(lambda: "acquired" in lab.reservation_states(), "a run locked b2")
        states = {r.get("prio", "0"): r["state"] for r in lab.reservations()}
        assert states == {"10.0": "acquired", "0": "waiting"}  # ... is served second
        wait_until(
            lambda: probe(boards["b2"].entry).reservation_waiters == 1, "the priority run at b2's daemon"
        )
        b2_hog.release()
        for run in runs[::-1]:
            code, stdout, stderr = run.finish()
            assert code == 0, stderr[-3000:]
            assert "b2 @ host-a" in stdout
    finally:
        stopped(runs)
    assert lab.acquired() == {}
    assert lab.reservation_states() == []


def test_farm_check_reaches_the_places_through_the_coordinator(lab: Lab, boards: dict[str, Board]) -> None:
    done = cli("farm", "check", "--labgrid", lab.address, "--json")
    assert done.returncode == 0, done.stderr
    devices = {d["name"]: d for d in json.loads(done.stdout)["devices"]}
    assert sorted(devices) == ["b0", "b1", "b2"]
    assert all(d["reachable"] for d in devices.values())
    assert (devices[ADB_BOARD]["host"], devices[ADB_BOARD]["address"]) == (
        "host-b",
        boards[ADB_BOARD].entry.address,
    )
    assert devices["b2"]["soc"] == "rk3566"
    assert lab.acquired() == {}  # checking reserves nothing
    # A tag that disagrees with the board, and a place the tags match that has no RKNN board.
    lab.client("-p", "b0", "set-tags", "runtime_version=librknnrt-0.0")
    lab.client("-p", "scope", "create")
    try:
        lab.client("-p", "scope", "set-tags", "soc=rk3588", "rack=r1")
        done = cli("farm", "check", "--labgrid", lab.address, "--soc", "rk3588")
        assert done.returncode == 1, done.stderr
        assert "b0: labelled runtime_version = 'librknnrt-0.0' but the board reports" in done.stderr
        assert "place scope has the tags" in done.stderr
        assert 'name = "b1"' in done.stdout and 'name = "b2"' not in done.stdout  # the places as farm.toml
    finally:
        lab.client("-p", "scope", "delete")
        lab.client(
            "-p", "b0", "set-tags", f"runtime_version={facts(boards['b0'].status())['runtime_version']}"
        )
