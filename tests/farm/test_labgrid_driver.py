"""labgrid's own way in: an environment that imports rknn_client.farm.labgrid_driver binds an
RKNNDriver to the RemotePlace it holds and gets a Device on that board, over TCP and through an
adb-attached board's forwarded daemon alike. Run on labgrid-client's interpreter with rknn_client
from this tree beside it, as a lab that installs rknn-client next to labgrid would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.farm.labgrid_fixtures import ADB_BOARD, SOCS, Board, boards, lab
from tests.farm.labgrid_lab import Lab

__all__ = ["boards", "lab"]  # the module's lab, used as fixtures

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
from labgrid import Environment

target = Environment(sys.argv[1]).get_target("main")
driver = target.get_driver("RKNNDriver")
target.activate(driver)
device = driver.device
device.health()  # raises unless SERVING
print(json.dumps({"soc": device.info().soc, "url": driver.url}))
target.deactivate(driver)
assert driver.device is None
"""


def _environment(folder: Path, lab: Lab, place: str) -> Path:
    config = folder / "env.yaml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "targets": {
                    "main": {"resources": {"RemotePlace": {"name": place}}, "drivers": {"RKNNDriver": {}}}
                },
                "options": {"coordinator_address": lab.address},
                "imports": ["rknn_client.farm.labgrid_driver"],
            }
        )
    )
    return config


@pytest.mark.parametrize("place", ["b0", ADB_BOARD], ids=["tcp", "adb"])
def test_a_labgrid_environment_gets_a_device_on_the_place_it_holds(
    place: str, lab: Lab, boards: dict[str, Board], tmp_path: Path
) -> None:
    config = _environment(tmp_path, lab, place)
    lab.client("-p", place, "acquire")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LG_")}
        env["PYTHONPATH"] = str(ROOT / "src")
        ran = subprocess.run(
            [str(lab.bin_dir / "python"), "-c", SCRIPT, str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
    finally:
        lab.client("-p", place, "release")
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    assert got["soc"] == SOCS[place]
    resource = boards[place].resource
    assert got["url"] == f"tcp://{resource.params['address']}:{resource.params['port']}"
