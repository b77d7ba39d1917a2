"""Test farms: many boards behind one inventory, exclusive reservations, fan-out runs and reports.

farm = Farm.from_file("farm.toml")
with farm.acquire(soc="rk3588", labels={"rack": "r1"}, timeout=600) as device:
    with device.load("model.rknn") as session:
        session.run([image])

The exports are imported at first use (rknn_client.lazy): the pytest plugin in this package loads in
every pytest run of a venv, `[server]`-only ones included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rknn_client.lazy import lazy_exports

if TYPE_CHECKING:
    from rknn_client.farm.inventory import DeviceEntry, FarmConfigError, load_farm_file, parse_address
    from rknn_client.farm.pool import (
        AcquireTimeout,
        Cancelled,
        Farm,
        Lease,
        NoMatchingDevice,
        NoReachableDevice,
    )

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
_INVENTORY = ("DeviceEntry", "FarmConfigError", "load_farm_file", "parse_address")
__getattr__ = lazy_exports(
    __name__,
    {
        name: "rknn_client.farm.inventory" if name in _INVENTORY else "rknn_client.farm.pool"
        for name in __all__
    },
)
