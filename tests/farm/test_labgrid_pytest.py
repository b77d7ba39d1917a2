"""A user's own suite run with xdist on labgrid's places: each test gets a board through the
coordinator, the workers share the lab's places and never hold one at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.farm.labgrid_fixtures import HOSTS, SOCS, Board, boards, lab
from tests.farm.labgrid_lab import Lab

__all__ = ["boards", "lab"]  # the module's lab, used as fixtures

SAMPLE_SUITE = """
import json
import os
import subprocess

import numpy as np
import pytest

from rknn_client.farm.probe import probe

HELD = os.environ["SAMPLE_HELD"]


def record(request, lease, soc):
    place = lease.entry.name
    # A file per place held, made only if absent: a second test holding the place at once fails here.
    marker = os.open(os.path.join(HELD, place), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    try:
        who = subprocess.run(["labgrid-client", "who"], capture_output=True, text=True, check=True).stdout
        line = {
            "test": request.node.nodeid,
            "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "place": place,
            "host": lease.entry.host,
            "soc": probe(lease.entry).soc,
            "wanted_soc": soc,
            "reserved_by": probe(lease.entry).reserved_by,
            "who": [row.split()[2] for row in who.splitlines()[1:] if row.strip()],
        }
        with open(os.environ["SAMPLE_RESULTS"], "a") as out:
            out.write(json.dumps(line) + "\\n")
    finally:
        os.close(marker)
        os.remove(os.path.join(HELD, place))


@pytest.mark.parametrize("seed", range(4))
def test_model_runs(request, rknn_lease, rknn_device, seed):
    with rknn_device.load(os.environ["SAMPLE_MODEL"]) as session:
        image = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        (logits,) = session.run([image])
        record(request, rknn_lease, None)
    assert logits.shape == (1, 10) and np.isfinite(logits).all()


@pytest.mark.rknn_soc("rk3588", "rk3566")
def test_each_soc(request, rknn_lease, rknn_device, rknn_soc):
    record(request, rknn_lease, rknn_soc)
    assert rknn_device.info().soc == rknn_soc
"""


def test_a_suite_with_xdist_gets_its_boards_through_the_coordinator(
    lab: Lab, boards: dict[str, Board], tmp_path: Path, cnn_model: Path
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_sample.py").write_text(SAMPLE_SUITE)
    (tmp_path / "held").mkdir()
    results = tmp_path / "results.jsonl"
    env = {
        **os.environ,
        "LG_COORDINATOR": lab.address,  # labgrid's variable: for the plugin and for `labgrid-client who`
        "SAMPLE_MODEL": str(cnn_model),
        "SAMPLE_RESULTS": str(results),
        "SAMPLE_HELD": str(tmp_path / "held"),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # only the plugins named here
    }
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", "2",
            "-p", "rknn_client.farm.pytest_plugin", "--rknn-labgrid-tag", "rack=r1",
            "--rknn-lease-timeout", "120", "-o", "addopts=", "--rootdir", str(suite), str(suite),
        ],
        capture_output=True, text=True, env=env, cwd=suite, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "6 passed" in run.stdout
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len({line["test"] for line in lines}) == len(lines) == 6
    for line in lines:
        assert line["place"] in line["who"], line  # `labgrid-client who` shows the place the test holds
        assert line["test"] in line["reserved_by"] and line["worker"] in line["reserved_by"], line
        assert line["host"] == HOSTS[line["place"]]
        if line["wanted_soc"]:
            assert line["soc"] == SOCS[line["place"]] == line["wanted_soc"], line
    assert {line["worker"] for line in lines} == {"gw0", "gw1"}
    assert lab.acquired() == {}
    assert lab.reservation_states() == []
