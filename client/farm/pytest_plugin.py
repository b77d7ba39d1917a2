"""pytest plugin: run a test suite against leased farm boards.

    pytest --rknn-farm farm.toml -p xdist -n 4      # or --rknn-device tcp://HOST:PORT (repeatable)

    @pytest.mark.rknn_soc("rk3588", "rk3566")      # runs once per SoC, each on a board of that SoC
    @pytest.mark.rknn_labels(rack="r1")
    def test_model(rknn_device):
        with rknn_device.load("model.rknn") as session:
            ...

Every test that uses `rknn_device` (or `rknn_lease`) gets an exclusive reservation of a matching
healthy board for its duration, so pytest-xdist workers each work on their own board. Without
--rknn-farm / --rknn-device those tests are skipped. When no matching board is reachable, the test
fails at once with each board's reason (`--rknn-unreachable skip` skips it instead).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rknn_client.api import Device
    from rknn_client.farm.pool import Farm, Lease

# pytest loads this entry point in every run of a venv holding the project, a board's `[server]`-only
# one too: the farm's modules are imported when a farm fixture is used, not at every pytest start.


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rknn-farm", "RKNN test farm")
    group.addoption(
        "--rknn-farm", metavar="FARM_TOML", help="farm.toml whose boards the rknn_device fixture leases"
    )
    group.addoption(
        "--rknn-device",
        action="append",
        default=[],
        metavar="ADDR",
        help="a board to lease (tcp://HOST:PORT, dns://NAME:PORT, adb:SERIAL); repeatable",
    )
    group.addoption(
        "--rknn-lease-timeout", type=float, default=600.0, metavar="S", help="wait S s for a free board"
    )
    group.addoption(
        "--rknn-unreachable",
        choices=("fail", "skip"),
        default="fail",
        help="what a test does when no matching board is reachable (default: fail, with the reasons)",
    )
    group.addoption(
        "--rknn-reservation-ttl",
        type=float,
        default=30.0,
        metavar="S",
        help="a crashed run's boards return to the farm after S s",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rknn_soc(*socs): run the test on a leased board of each SoC (one test per SoC)"
    )
    config.addinivalue_line("markers", "rknn_labels(**labels): lease only boards with these farm labels")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("rknn_soc")
    if marker is not None and "rknn_soc" in metafunc.fixturenames:
        socs = [str(s).lower() for s in marker.args]
        metafunc.parametrize("rknn_soc", socs, ids=socs)


@pytest.fixture(scope="session")
def rknn_farm(pytestconfig: pytest.Config) -> Farm:
    """The farm given on the command line (tests needing it are skipped when none is)."""
    farm_file = pytestconfig.getoption("rknn_farm")
    addresses = pytestconfig.getoption("rknn_device")
    if not farm_file and not addresses:
        pytest.skip("no RKNN farm: give --rknn-farm farm.toml or --rknn-device ADDR")
    from rknn_client.farm.pool import Farm, default_holder

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return Farm.from_sources(
        farm_file,
        addresses,
        holder=default_holder(f"pytest {worker}".strip()),
        ttl_s=pytestconfig.getoption("rknn_reservation_ttl"),
    )


@pytest.fixture
def rknn_soc() -> str | None:
    """The SoC this test needs (set by @pytest.mark.rknn_soc); None: any board."""
    return None


@pytest.fixture
def rknn_lease(
    request: pytest.FixtureRequest, rknn_farm: Farm, rknn_soc: str | None, pytestconfig: pytest.Config
) -> Iterator[Lease]:
    """An exclusive reservation of a matching board for this test."""
    marker = request.node.get_closest_marker("rknn_labels")
    from rknn_client.farm.pool import NoReachableDevice

    labels = {str(k): str(v) for k, v in marker.kwargs.items()} if marker else {}
    try:
        lease = rknn_farm.acquire(
            soc=rknn_soc,
            labels=labels,
            timeout=pytestconfig.getoption("rknn_lease_timeout"),
            holder=f"{rknn_farm.holder} {request.node.nodeid}",
        )
    except NoReachableDevice as exc:
        if pytestconfig.getoption("rknn_unreachable") == "skip":
            pytest.skip(str(exc))
        pytest.fail(str(exc), pytrace=False)
    request.node.user_properties.append(("rknn_device", lease.entry.name))
    try:
        yield lease
    finally:
        lease.release()


@pytest.fixture
def rknn_device(rknn_lease: Lease) -> Device:
    """A connected client Device on the leased board (its calls carry the reservation)."""
    return rknn_lease.device
