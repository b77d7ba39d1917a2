"""`rknn-client farm run --labgrid` on a real labgrid lab: places chosen by tag, held one run at a time,
shown by `labgrid-client who`, and given back when a run is interrupted or killed."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rknn_client.farm import Farm, Lease
from rknn_client.farm.labgrid_farm import labgrid_python
from rknn_client.farm.probe import probe
from rknn_server.testing import DaemonProcess, start_daemon
from tests.cli_run import CliRun, cli
from tests.farm import labgrid_lab
from tests.farm.labgrid_lab import Lab, wait_until

# Board -> SoC: two rk3588 places on two exporters ("hosts"), one rk3566.
BOARDS = {"b0": "rk3588", "b1": "rk3588", "b2": "rk3566"}
EXPORTERS = {"host-a": ("b0", "b2"), "host-b": ("b1",)}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DaemonProcess]]:
    """The boards, shared by the tests of this module as the lab is (each test gives back what it
    held); started side by side, stopped by PID at the end."""
    root = tmp_path_factory.mktemp("labgrid-boards")

    def start(board: str) -> DaemonProcess:
        args = ["--runtime", "host", "--soc", BOARDS[board]]
        return start_daemon(root / f"{board}-cache", root / f"{board}.log", args)

    with ThreadPoolExecutor(len(BOARDS)) as pool:
        started = dict(zip(BOARDS, pool.map(start, BOARDS), strict=True))
    yield started
    for daemon in started.values():
        daemon.stop()


@pytest.fixture(scope="module")
def lab(daemons: dict[str, DaemonProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The lab, with labgrid-client on PATH (as `pipx install labgrid` puts it) and no LG_* variable
    of the machine's in the way."""
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
            lab.add_exporters({e: {b: daemons[b] for b in boards} for e, boards in EXPORTERS.items()})
            lab.add_places(
                {b: (e, {"soc": BOARDS[b], "rack": "r1"}) for e, boards in EXPORTERS.items() for b in boards}
            )
            yield lab
        finally:
            lab.stop()


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "input.npy"
    np.save(path, np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32))
    return path


@pytest.fixture
def b2_hog(daemons: dict[str, DaemonProcess]) -> Iterator[Lease]:
    """b2's daemon reserved outside labgrid: a run holding place b2 then waits in the daemon's queue,
    holding the place without the CPU a running model would take."""
    lease = Farm.from_sources(None, [daemons["b2"].url]).acquire(timeout=30, holder="hog")
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
    assert sorted(devices) == ["b0", "b1"]
    assert all(d["ok"] and d["agrees"] and d["soc"] == "rk3588" for d in devices.values())
    assert devices["b0"]["labels"] == {"soc": "rk3588", "rack": "r1"}
    assert lab.acquired() == {}
    assert lab.reservation_states() == []


def test_a_second_run_waits_until_the_first_gives_the_place_back(
    lab: Lab,
    daemons: dict[str, DaemonProcess],
    b2_hog: Lease,
    cnn_model: Path,
    image: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b2 = Farm.from_sources(None, [daemons["b2"].url]).entries[0]
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
    lab: Lab, daemons: dict[str, DaemonProcess], b2_hog: Lease, cnn_model: Path, image: Path
) -> None:
    # Labgrid keeps a lock after its client is gone (labgrid-client exits right after acquiring) ...
    lab.client("-p", "b0", "acquire")
    assert "b0" in lab.acquired()
    lab.client("-p", "b0", "release")
    # ... so a killed run's place is given back by its agent, which sees the run end.
    b2 = Farm.from_sources(None, [daemons["b2"].url]).entries[0]
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
