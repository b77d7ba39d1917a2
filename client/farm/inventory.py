"""Which boards make up a farm: explicit addresses, DNS names with many records, adb, farm.toml.

Addresses:
    tcp://HOST:PORT     one daemon
    dns://NAME:PORT     every A/AAAA record of NAME (e.g. a Kubernetes headless Service)
    adb:SERIAL          one board over adb
    adb                 every board attached to adb

farm.toml:
    [defaults]                                   # optional, merged into every device
    labels = { rack = "r1" }
    auth = { token_file = "~/.config/rknn/farm.token" }

    [[device]]
    name = "rk3588-a"
    address = "tcp://10.0.0.5:50515"
    labels = { soc = "rk3588", firmware = "1.6.0" }
    auth = { token = "..." }                     # or token_file = "..."
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rknn_client.farm.auth import DeviceAuth
from rknn_client.transport.base import TransportError
from rknn_client.transport.tcp import tcp_endpoint

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


class FarmConfigError(ValueError):
    """The farm description is wrong; the message names the file, the entry and what to fix."""


@dataclass(frozen=True)
class DeviceEntry:
    """One board of the farm, as configured (what it reports about itself comes from a probe)."""

    name: str
    address: str  # tcp://HOST:PORT or adb:SERIAL
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    auth: DeviceAuth | None = None
    place: str = ""  # the labgrid place it is, "" outside labgrid
    host: str = ""  # the labgrid exporter that publishes it

    def matches_labels(self, wanted: Mapping[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in wanted.items())

    def soc(self, reported: str) -> str:
        """The board's SoC: its `soc` label when configured, else what the daemon reports."""
        return self.labels.get("soc") or reported


def _dns_entries(name: str, address: str, resolver: Callable[..., Any]) -> list[DeviceEntry]:
    parts = urlsplit(address)
    if not parts.hostname or parts.port is None:
        raise FarmConfigError(f"{address!r}: a DNS source needs a name and a port, dns://NAME:PORT")
    try:
        records = resolver(parts.hostname, parts.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FarmConfigError(f"{address!r}: {parts.hostname} does not resolve: {exc}") from exc
    hosts = list(dict.fromkeys(str(r[4][0]) for r in records))
    return [DeviceEntry(name=f"{name}[{host}]", address=tcp_address(host, parts.port)) for host in hosts]


def tcp_address(host: str, port: int) -> str:
    """tcp://HOST:PORT, an IPv6 address in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _adb_entries() -> list[DeviceEntry]:
    from rknn_client.transport.adb import list_adb_devices

    return [
        DeviceEntry(name=d.serial, address=f"adb:{d.serial}")
        for d in list_adb_devices()
        if d.state == "device"
    ]


def parse_address(
    address: str, name: str | None = None, resolver: Callable[..., Any] = socket.getaddrinfo
) -> list[DeviceEntry]:
    """The device(s) one address stands for."""
    text = address.strip()
    if text.startswith("tcp://"):
        try:
            normalized = tcp_endpoint(text).description
        except TransportError as exc:
            raise FarmConfigError(str(exc)) from None
        return [DeviceEntry(name=name or text.removeprefix("tcp://"), address=normalized)]
    if text.startswith("dns://"):
        return _dns_entries(name or text.removeprefix("dns://"), text, resolver)
    if text.startswith("adb:"):
        serial = text.removeprefix("adb:")
        return [DeviceEntry(name=name or serial, address=text)]
    if text == "adb":
        return _adb_entries()
    raise FarmConfigError(
        f"{address!r} is not a farm address; expected tcp://HOST:PORT, dns://NAME:PORT, adb:SERIAL or adb"
    )


def _labels(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or any(isinstance(v, (dict, list)) for v in raw.values()):
        raise FarmConfigError(f'{where}: labels must be a table of simple values, e.g. {{ soc = "rk3588" }}')
    labels = {str(k): str(v) for k, v in raw.items()}
    if "soc" in labels:
        labels["soc"] = labels["soc"].lower()
    return labels


def _auth(raw: Any, where: str, base: Path) -> DeviceAuth | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"token", "token_file"} or len(raw) != 1:
        raise FarmConfigError(f'{where}: auth must be {{ token = "..." }} or {{ token_file = "PATH" }}')
    if "token" in raw:
        return DeviceAuth(token=str(raw["token"]))
    path = Path(str(raw["token_file"])).expanduser()
    return DeviceAuth(token_file=path if path.is_absolute() else base / path)


def read_farm_file(
    path: Path | str, resolver: Callable[..., Any] = socket.getaddrinfo
) -> tuple[list[DeviceEntry], list[str]]:
    """The devices a farm.toml describes, and every problem found in it (one message each, naming
    the file, the entry and what to fix): the devices with no problem are still returned."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        return [], [f"cannot read the farm file {path}: {exc}"]
    except tomllib.TOMLDecodeError as exc:
        return [], [f"{path} is not valid TOML: {exc}"]
    problems: list[str] = []
    unknown = set(data) - {"defaults", "device"}
    if unknown:
        problems.append(f"{path}: unknown section(s) {sorted(unknown)}; expected [defaults] and [[device]]")
    defaults = data.get("defaults", {})
    default_labels: dict[str, str] = {}
    default_auth = None
    try:
        default_labels = _labels(defaults.get("labels"), f"{path} [defaults]")
        default_auth = _auth(defaults.get("auth"), f"{path} [defaults]", path.parent)
    except FarmConfigError as exc:
        problems.append(str(exc))
    devices = data.get("device", [])
    if not isinstance(devices, list):
        return [], [*problems, f"{path}: devices are [[device]] tables (an array), not [device]"]
    entries: list[DeviceEntry] = []
    for position, raw in enumerate(devices, start=1):
        try:
            entries += _device(
                raw, f"{path} device #{position}", path.parent, default_labels, default_auth, resolver
            )
        except FarmConfigError as exc:
            problems.append(str(exc))
    named = _first_of_each_name(entries, problems)
    return named, problems


def _device(
    raw: Any,
    where: str,
    base: Path,
    default_labels: Mapping[str, str],
    default_auth: DeviceAuth | None,
    resolver: Callable[..., Any],
) -> list[DeviceEntry]:
    if not isinstance(raw, dict) or "address" not in raw:
        raise FarmConfigError(f"{where}: every [[device]] needs an address")
    unknown = set(raw) - {"name", "address", "labels", "auth"}
    if unknown:
        raise FarmConfigError(
            f"{where}: unknown key(s) {sorted(unknown)}; expected name, address, labels, auth"
        )
    labels = {**default_labels, **_labels(raw.get("labels"), where)}
    auth = _auth(raw.get("auth"), where, base) or default_auth
    name = str(raw["name"]) if "name" in raw else None
    try:
        found = parse_address(str(raw["address"]), name, resolver)
    except FarmConfigError as exc:
        raise FarmConfigError(f"{where}: {exc}") from None
    return [replace(e, labels=labels, auth=auth) for e in found]


def load_farm_file(path: Path | str, resolver: Callable[..., Any] = socket.getaddrinfo) -> list[DeviceEntry]:
    """The devices a farm.toml describes; relative token files are relative to the file. Raises
    FarmConfigError listing every problem, one per line."""
    entries, problems = read_farm_file(path, resolver)
    if problems:
        raise FarmConfigError("\n".join(problems))
    return entries


def _first_of_each_name(entries: Iterable[DeviceEntry], problems: list[str]) -> list[DeviceEntry]:
    """Names are how reports and reservations tell boards apart: a second device of a name is a
    problem (and left out)."""
    seen: dict[str, DeviceEntry] = {}
    for entry in entries:
        if entry.name in seen:
            problems.append(
                f"two devices are named {entry.name!r} ({seen[entry.name].address} and {entry.address}); "
                "give each a distinct name"
            )
        else:
            seen[entry.name] = entry
    return list(seen.values())


def unique_names(entries: Iterable[DeviceEntry]) -> list[DeviceEntry]:
    """Refuse two devices of one name."""
    problems: list[str] = []
    named = _first_of_each_name(entries, problems)
    if problems:
        raise FarmConfigError("\n".join(problems))
    return named


def gather(farm_file: Path | str | None = None, addresses: Iterable[str] = ()) -> list[DeviceEntry]:
    """Every device of a farm file plus explicit addresses."""
    entries = load_farm_file(farm_file) if farm_file else []
    for address in addresses:
        entries += parse_address(address)
    return unique_names(entries)
