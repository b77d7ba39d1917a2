"""Test farms: many boards behind one inventory, exclusive reservations, fan-out runs and reports.

farm = Farm.from_file("farm.toml")
with farm.acquire(soc="rk3588", labels={"rack": "r1"}, timeout=600) as device:
    with device.load("model.rknn") as session:
        session.run([image])
"""

from __future__ import annotations

from rknn_client.farm.inventory import DeviceEntry, FarmConfigError, load_farm_file, parse_address
from rknn_client.farm.pool import AcquireTimeout, Cancelled, Farm, Lease, NoMatchingDevice, NoReachableDevice

__all__ = [
    "AcquireTimeout",
    "Cancelled",
    "DeviceEntry",
    "Farm",
    "FarmConfigError",
    "Lease",
    "NoMatchingDevice",
    "NoReachableDevice",
    "load_farm_file",
    "parse_address",
]
