"""labgrid's side of an RKNN board: its resources and a driver that gives a test a `Device`.

For suites that use labgrid's own pytest plugin or `Environment` (`--lg-env env.yaml`) rather
than rknn-client's: the environment names this module under `imports:`, a target binds an
`RKNNDriver` to the `RemotePlace` it holds, and `target.get_driver("RKNNDriver").device` is a
connected `rknn_client.Device` on that board's daemon while the driver is active. The place's
labgrid lock is what keeps other labgrid users off the board; `Device.reserve` also keeps off PCs
outside labgrid (`rknn-client farm run --labgrid` takes both).

The resource classes are what exporters publish (docs/farm.md): `RKNNDaemon` (a daemon on the
network) and `RKNNAdbDaemon` (an adb-attached board whose host forwards its daemon); labgrid makes
them from the exporter's parameters on the client. Imported only by labgrid (it imports labgrid);
rknn-client itself never imports it.
"""

from __future__ import annotations

from typing import Any

import attr
from labgrid.driver.common import Driver
from labgrid.factory import target_factory
from labgrid.resource.common import Resource

from rknn_client.device import Device
from rknn_client.transport.tcp import tcp_endpoint


@target_factory.reg_resource
@attr.s(eq=False)
class RKNNDaemon(Resource):
    """A board's daemon on the network: `rknn_server serve --listen tcp://0.0.0.0:PORT`."""

    address: str = attr.ib(validator=attr.validators.instance_of(str))
    port: int = attr.ib(default=50515, validator=attr.validators.instance_of(int))


@target_factory.reg_resource
@attr.s(eq=False)
class RKNNAdbDaemon(Resource):
    """An adb-attached board: its serial, and where its host forwards the board's daemon."""

    serial: str = attr.ib(validator=attr.validators.instance_of(str))
    address: str = attr.ib(validator=attr.validators.instance_of(str))
    port: int = attr.ib(validator=attr.validators.instance_of(int))


@target_factory.reg_driver
@attr.s(eq=False)
class RKNNDriver(Driver):
    """A connected `Device` on the place's daemon (`.device`) while active."""

    bindings = {"daemon": {"RKNNDaemon", "RKNNAdbDaemon"}}  # noqa: RUF012 (labgrid's own form)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.device: Device | None = None

    @property
    def url(self) -> str:
        daemon: Any = self.daemon
        return f"tcp://{daemon.address}:{daemon.port}"

    def on_activate(self) -> None:
        self.device = Device(tcp_endpoint(self.url))

    def on_deactivate(self) -> None:
        device, self.device = self.device, None
        if device is not None:
            device.close()
