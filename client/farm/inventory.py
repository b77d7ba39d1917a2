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
    return [
        DeviceEntry(
            name=f"{name}[{host}]",
            address=f"tcp://[{host}]:{parts.port}" if ":" in host else f"tcp://{host}:{parts.port}",
        )
        for host in hosts
    ]


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
        return [DeviceEntry(name=name or text.removeprefix("tcp://"), address=text)]
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


def load_farm_file(path: Path | str, resolver: Callable[..., Any] = socket.getaddrinfo) -> list[DeviceEntry]:
    """The devices a farm.toml describes; relative token files are relative to the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise FarmConfigError(f"cannot read the farm file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise FarmConfigError(f"{path} is not valid TOML: {exc}") from exc
    unknown = set(data) - {"defaults", "device"}
    if unknown:
        raise FarmConfigError(
            f"{path}: unknown section(s) {sorted(unknown)}; expected [defaults] and [[device]]"
        )
    defaults = data.get("defaults", {})
    default_labels = _labels(defaults.get("labels"), f"{path} [defaults]")
    default_auth = _auth(defaults.get("auth"), f"{path} [defaults]", path.parent)
    entries: list[DeviceEntry] = []
    for position, raw in enumerate(data.get("device", []), start=1):
        where = f"{path} device #{position}"
        if not isinstance(raw, dict) or "address" not in raw:
            raise FarmConfigError(f"{where}: every [[device]] needs an address")
        unknown = set(raw) - {"name", "address", "labels", "auth"}
        if unknown:
            raise FarmConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
        labels = {**default_labels, **_labels(raw.get("labels"), where)}
        auth = _auth(raw.get("auth"), where, path.parent) or default_auth
        name = str(raw["name"]) if "name" in raw else None
        entries += [
            replace(e, labels=labels, auth=auth) for e in parse_address(str(raw["address"]), name, resolver)
        ]
    return unique_names(entries)


def unique_names(entries: Iterable[DeviceEntry]) -> list[DeviceEntry]:
    """Refuse two devices of one name: names are how reports and reservations tell boards apart."""
    seen: dict[str, DeviceEntry] = {}
    for entry in entries:
        if entry.name in seen:
            raise FarmConfigError(
                f"two devices are named {entry.name!r} ({seen[entry.name].address} and {entry.address}); "
                "give each a distinct name"
            )
        seen[entry.name] = entry
    return list(seen.values())


def gather(farm_file: Path | str | None = None, addresses: Iterable[str] = ()) -> list[DeviceEntry]:
    """Every device of a farm file plus explicit addresses."""
    entries = load_farm_file(farm_file) if farm_file else []
    for address in addresses:
        entries += parse_address(address)
    return unique_names(entries)
