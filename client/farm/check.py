"""`rknn-client farm check farm.toml` (or `--labgrid`): validate an inventory and reach every device in it.

Like `docker compose config`: prints the normalized inventory (defaults merged into each device,
addresses normalized, DNS names expanded, literal tokens hidden) on stdout, and on stderr a table
of what each device answered (health, then GetInfo and the version check) and one message per
problem. Problems: any
error in the file, a token that cannot be read, two devices at one address, a device that does not
answer, a device whose soc label (or runtime, runtime_version, daemon_version, driver_version)
disagrees with what it reports. With labgrid the inventory is the coordinator's places (their tags
are the labels), and a place that matches more than one RKNN resource, or a tag filter that also
matches places without one, is a problem too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rknn_client.farm.auth import AuthError
from rknn_client.farm.inventory import DeviceEntry, FarmConfigError, parse_address, read_farm_file
from rknn_client.farm.labgrid_farm import RESOURCE_CLASSES, coordinator_address, labgrid_python, list_places
from rknn_client.farm.pool import Farm
from rknn_client.farm.probe import DeviceStatus

HIDDEN_TOKEN = "<hidden>"
# Labels (labgrid tags) that state a fact the board reports: label -> DeviceStatus field.
FACT_LABELS = {
    "soc": "reported_soc",
    "runtime": "runtime",
    "runtime_version": "runtime_version",
    "daemon_version": "daemon_version",
    "driver_version": "driver_version",
}


@dataclass
class CheckResult:
    entries: list[DeviceEntry]
    statuses: list[DeviceStatus] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def gather_checked(farm_file: Path | None, addresses: Iterable[str]) -> CheckResult:
    """Every device of the file and addresses that could be read, and every problem on the way."""
    entries, problems = read_farm_file(farm_file) if farm_file else ([], [])
    for address in addresses:
        try:
            entries += parse_address(address)
        except FarmConfigError as exc:
            problems.append(f"--devices {address}: {exc}")
    return CheckResult(entries, problems=problems)


def gather_labgrid(coordinator: str | None, tags: dict[str, str]) -> CheckResult:
    """The places of the coordinator whose tags include `tags`, and every problem with them."""
    places = list_places(labgrid_python(), coordinator_address(coordinator), tags)
    result = CheckResult(places.entries, problems=places.problems)
    if tags and places.others:  # a test asking for these tags could be handed one of them
        result.problems += [
            f"place {name} has the tags {tags} but no {' or '.join(RESOURCE_CLASSES)} resource"
            for name in sorted(places.others)
        ]
    return result


def check(farm_file: Path | None, addresses: Iterable[str], probe_timeout_s: float = 3.0) -> CheckResult:
    return check_devices(gather_checked(farm_file, addresses), probe_timeout_s)


def check_devices(result: CheckResult, probe_timeout_s: float = 3.0) -> CheckResult:
    """Reach every device gathered; adds the problems found to `result`."""
    seen: dict[str, str] = {}
    named: list[DeviceEntry] = []
    unreadable: set[str] = set()  # devices whose token cannot be read: said once, not again as unreachable
    for entry in result.entries:
        if entry.name in {e.name for e in named}:
            result.problems.append(f"two devices are named {entry.name!r}; give each a distinct name")
            continue
        named.append(entry)
        if entry.address in seen:
            result.problems.append(
                f"{seen[entry.address]} and {entry.name} are the same device ({entry.address})"
            )
        seen.setdefault(entry.address, entry.name)
        if entry.auth is not None:
            try:
                entry.auth.resolve()
            except AuthError as exc:
                result.problems.append(f"{entry.name}: {exc}")
                unreadable.add(entry.name)
    result.entries = named
    result.statuses = Farm(named, probe_timeout_s=probe_timeout_s).statuses()
    for status in result.statuses:
        name = status.entry.name
        if not status.healthy:
            if name not in unreadable:
                result.problems.append(f"{name}: unreachable: {status.error}")
            continue
        for key, reported in _wrong_facts(status):
            result.problems.append(
                f"{name}: labelled {key} = {status.entry.labels[key]!r} but the board reports {reported!r}; "
                "fix the label (or remove it to use what the board reports)"
            )
    return result


def _wrong_facts(status: DeviceStatus) -> list[tuple[str, str]]:
    """The fact labels of a device that answered which disagree with what it reports, in any case: a
    label agrees with the whole or one word of it (`runtime_version = "2.3.2"` with "librknnrt 2.3.2")."""
    wrong = []
    for key, attribute in FACT_LABELS.items():
        label, reported = status.entry.labels.get(key, "").lower(), str(getattr(status, attribute))
        if label and reported and label not in {reported.lower(), *reported.lower().split()}:
            wrong.append((key, reported))
    return wrong


def _toml_value(value: object) -> str:
    """TOML for a string or a table of strings (JSON strings are TOML basic strings)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def normalized_toml(entries: Iterable[DeviceEntry]) -> str:
    """The inventory as each device is used: defaults merged, DNS expanded, tokens hidden."""
    blocks = []
    for entry in entries:
        lines = ["[[device]]", f"name = {_toml_value(entry.name)}", f"address = {_toml_value(entry.address)}"]
        if entry.labels:
            lines.append(f"labels = {_toml_value(dict(entry.labels))}")
        if entry.auth is not None:
            auth = (
                {"token_file": str(entry.auth.token_file)}
                if entry.auth.token_file
                else {"token": HIDDEN_TOKEN}
            )
            lines.append(f"auth = {_toml_value(auth)}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def _name(entry: DeviceEntry) -> str:
    """A labgrid place reads "PLACE @ EXPORTER"."""
    return f"{entry.name} @ {entry.host}" if entry.host else entry.name


def status_table(statuses: Iterable[DeviceStatus]) -> str:
    rows = [["name", "address", "health", "soc", "daemon", "protocol", "result"]]  # soc: as reported
    for s in statuses:
        if s.healthy:
            rows.append(
                [
                    _name(s.entry),
                    s.entry.address,
                    "SERVING",
                    s.soc or "any",
                    s.daemon_version,
                    str(s.protocol_version),
                    "ok",
                ]
            )
        else:
            rows.append([_name(s.entry), s.entry.address, "DOWN", "-", "-", "-", s.error])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "".join(
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip() + "\n"
        for r in rows
    )


def result_dict(result: CheckResult) -> dict[str, object]:
    return {
        "ok": not result.problems,
        "problems": result.problems,
        "devices": [
            {
                "name": s.entry.name,
                "address": s.entry.address,
                "labels": dict(s.entry.labels),
                "place": s.entry.place,
                "host": s.entry.host,
                "auth": None
                if s.entry.auth is None
                else ("token_file" if s.entry.auth.token_file else "token"),
                "reachable": s.healthy,
                "error": s.error,
                "soc": s.soc,
                "daemon_version": s.daemon_version,
                "protocol_version": s.protocol_version,
                "runtime": s.runtime,
                "runtime_version": s.runtime_version,
            }
            for s in result.statuses
        ],
    }
