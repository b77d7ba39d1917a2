"""A user's own suite of ten tests run with xdist across three simulated boards, each on a lease."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rknn_server.testing import DaemonProcess

SAMPLE_SUITE = """
import json
import os

import numpy as np
import pytest

from rknn_client.farm.probe import probe

MODEL = os.environ["SAMPLE_MODEL"]


def record(request, lease, soc):
    status = probe(lease.entry)
    line = {
        "test": request.node.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
        "device": lease.entry.name,
        "soc": status.soc,
        "wanted_soc": soc,
        "reserved_by": status.reserved_by,
    }
    with open(os.environ["SAMPLE_RESULTS"], "a") as out:
        out.write(json.dumps(line) + "\\n")


@pytest.mark.parametrize("seed", range(7))
def test_model_runs(request, rknn_lease, rknn_device, seed):
    record(request, rknn_lease, None)
    with rknn_device.load(MODEL) as session:
        image = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        (logits,) = session.run([image])
    assert logits.shape == (1, 10) and np.isfinite(logits).all()


@pytest.mark.rknn_soc("rk3588", "rk3566", "rv1106")
def test_each_soc(request, rknn_lease, rknn_device, rknn_soc):
    record(request, rknn_lease, rknn_soc)
    assert rknn_device.info().soc == rknn_soc
"""


def test_sample_suite_runs_across_three_boards_with_xdist(
    tmp_path: Path, boards: list[DaemonProcess], farm_file: Path, cnn_model: Path
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_sample.py").write_text(SAMPLE_SUITE)
    results = tmp_path / "results.jsonl"
    env = {
        **os.environ,
        "SAMPLE_MODEL": str(cnn_model),
        "SAMPLE_RESULTS": str(results),
        # Only the plugins named here: the farm plugin may also be installed as an entry point.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", "3",
            "-p", "rknn_client.farm.pytest_plugin", "--rknn-farm", str(farm_file),
            "--rknn-lease-timeout", "120", "-o", "addopts=", "--rootdir", str(suite), str(suite),
        ],
        capture_output=True, text=True, env=env, cwd=suite,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "10 passed" in run.stdout
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == 10 and len({line["test"] for line in lines}) == 10
    for line in lines:
        # Each test ran on a board reserved for that very test.
        assert line["test"] in line["reserved_by"], line
        assert line["worker"] in line["reserved_by"]
        if line["wanted_soc"]:
            assert line["soc"] == line["wanted_soc"]
    assert {line["device"] for line in lines} == {"b0", "b1", "b2"}
    assert len({line["worker"] for line in lines}) == 3


def test_without_a_farm_the_tests_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "test_needs_board.py").write_text("def test_board(rknn_device):\n    raise AssertionError\n")
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "rknn_client.farm.pytest_plugin", "-o", "addopts=",
            "-rs", "--rootdir", str(tmp_path), str(tmp_path),
        ],
        capture_output=True, text=True, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout
    assert "1 skipped" in run.stdout and "--rknn-farm" in run.stdout


@pytest.mark.parametrize(("option", "outcome", "code"), [("fail", "1 error", 1), ("skip", "1 skipped", 0)])
def test_an_unreachable_board_fails_or_skips_the_test_at_once(
    tmp_path: Path, option: str, outcome: str, code: int
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    (tmp_path / "test_needs_board.py").write_text("def test_board(rknn_device):\n    pass\n")
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "rknn_client.farm.pytest_plugin", "-o", "addopts=",
            "-rs", "--rknn-device", dead, "--rknn-lease-timeout", "300", "--rknn-unreachable", option,
            "--rootdir", str(tmp_path), str(tmp_path),
        ],
        capture_output=True, text=True, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert time.monotonic() - started < 60
    assert run.returncode == code, run.stdout
    assert outcome in run.stdout
    assert (
        "is reachable" in run.stdout
        and "unreachable" in run.stdout
        and dead.removeprefix("tcp://") in run.stdout
    )
