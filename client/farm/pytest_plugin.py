"""pytest plugin: run a test suite against leased farm boards.

    pytest --rknn-farm farm.toml -p xdist -n 4      # or --rknn-device tcp://HOST:PORT (repeatable)
    pytest --rknn-labgrid HOST:PORT [--rknn-labgrid-tag rack=r1] -p xdist -n 4   # labgrid's places

    @pytest.mark.rknn_soc("rk3588", "rk3566")      # runs once per SoC, each on a board of that SoC
    @pytest.mark.rknn_labels(rack="r1")
    def test_model(rknn_device):
        with rknn_device.load("model.rknn") as session:
            ...

Every test that uses `rknn_device` (or `rknn_lease`) gets an exclusive reservation of a matching
healthy board for its duration, so pytest-xdist workers each work on their own board. With
--rknn-labgrid (or labgrid's LG_COORDINATOR and no farm) the boards are the places of labgrid's
coordinator: a test reserves one by tags (its SoC, its labels, the --rknn-labgrid-tag ones) in the
coordinator's queue and locks it, then reserves its daemon, through the same acquire as a farm's;
the coordinator hands each place to one reservation at a time, which is how the workers share the
lab. Without any of these the tests are skipped. When no matching board is reachable, the test
fails at once with each board's reason (`--rknn-unreachable skip` skips it instead).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rknn_client.device import Device
    from rknn_client.farm.labgrid_farm import LabgridFarm, PlaceLease
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
        "--rknn-labgrid",
        nargs="?",
        const="",
        metavar="HOST:PORT",
        help="lease labgrid's places through its coordinator (default: $LG_COORDINATOR, else 127.0.0.1:20408)",
    )
    group.addoption(
        "--rknn-labgrid-tag",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only labgrid places with this tag (repeatable), beside a test's SoC and labels",
    )
    group.addoption(
        "--rknn-labgrid-priority",
        type=float,
        default=0.0,
        metavar="P",
        help="labgrid's reservation priority of this run's tests (default 0)",
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
def rknn_farm(pytestconfig: pytest.Config) -> Farm | LabgridFarm:
    """The farm given on the command line, or labgrid's places (tests needing it are skipped when
    there is neither)."""
    farm_file = pytestconfig.getoption("rknn_farm")
    addresses = pytestconfig.getoption("rknn_device")
    coordinator = pytestconfig.getoption("rknn_labgrid")
    if coordinator is None and not farm_file and not addresses and "LG_COORDINATOR" in os.environ:
        coordinator = ""
    if coordinator is None and not farm_file and not addresses:
        pytest.skip(
            "no RKNN farm: give --rknn-farm farm.toml, --rknn-device ADDR or --rknn-labgrid HOST:PORT"
        )
    from rknn_client.farm.pool import Farm, default_holder

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    options = {
        "holder": default_holder(f"pytest {worker}".strip()),
        "ttl_s": pytestconfig.getoption("rknn_reservation_ttl"),
    }
    if coordinator is None:
        return Farm.from_sources(farm_file, addresses, **options)
    if farm_file or addresses:
        raise pytest.UsageError("give either --rknn-labgrid or --rknn-farm/--rknn-device, not both")
    from rknn_client.farm.labgrid_farm import LabgridFarm

    tags = dict(_tag(text) for text in pytestconfig.getoption("rknn_labgrid_tag"))
    priority = pytestconfig.getoption("rknn_labgrid_priority")
    return LabgridFarm(coordinator or None, tags, priority=priority, **options)


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise pytest.UsageError(f"--rknn-labgrid-tag {text!r}: expected KEY=VALUE")
    return key, value


@pytest.fixture
def rknn_soc() -> str | None:
    """The SoC this test needs (set by @pytest.mark.rknn_soc); None: any board."""
    return None


@pytest.fixture
def rknn_lease(
    request: pytest.FixtureRequest,
    rknn_farm: Farm | LabgridFarm,
    rknn_soc: str | None,
    pytestconfig: pytest.Config,
) -> Iterator[Lease | PlaceLease]:
    """An exclusive reservation of a matching board for this test (with labgrid: of its place too)."""
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
def rknn_device(rknn_lease: Lease | PlaceLease) -> Device:
    """A connected client Device on the leased board (its calls carry the reservation)."""
    return rknn_lease.device
