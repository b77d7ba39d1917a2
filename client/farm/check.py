"""`rknn-client farm check farm.toml`: validate an inventory and reach every device in it.

Like `docker compose config`: prints the normalized inventory (defaults merged into each device,
addresses normalized, DNS names expanded, literal tokens hidden) on stdout, and on stderr a table
of what each device answered (health, then GetInfo and the version check) and one message per
problem. Problems: any
error in the file, a token that cannot be read, two devices at one address, a device that does not
answer, a device whose soc label disagrees with the SoC it reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rknn_client.farm.auth import AuthError
from rknn_client.farm.inventory import DeviceEntry, FarmConfigError, parse_address, read_farm_file
from rknn_client.farm.pool import Farm
from rknn_client.farm.probe import DeviceStatus

HIDDEN_TOKEN = "<hidden>"


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


def check(farm_file: Path | None, addresses: Iterable[str], probe_timeout_s: float = 3.0) -> CheckResult:
    result = gather_checked(farm_file, addresses)
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
        name, label = status.entry.name, status.entry.labels.get("soc")
        if not status.healthy and name not in unreadable:
            result.problems.append(f"{name}: unreachable: {status.error}")
        elif label and status.reported_soc and label != status.reported_soc.lower():
            result.problems.append(
                f"{name}: labelled soc = {label!r} but the board reports {status.reported_soc!r}; "
                "fix the label (or remove it to use what the board reports)"
            )
    return result


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


def status_table(statuses: Iterable[DeviceStatus]) -> str:
    rows = [["name", "address", "health", "soc", "daemon", "protocol", "result"]]  # soc: as reported
    for s in statuses:
        if s.healthy:
            rows.append(
                [
                    s.entry.name,
                    s.entry.address,
                    "SERVING",
                    s.soc or "any",
                    s.daemon_version,
                    str(s.protocol_version),
                    "ok",
                ]
            )
        else:
            rows.append([s.entry.name, s.entry.address, "DOWN", "-", "-", "-", s.error])
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
                "auth": None
                if s.entry.auth is None
                else ("token_file" if s.entry.auth.token_file else "token"),
                "reachable": s.healthy,
                "error": s.error,
                "soc": s.soc,
                "daemon_version": s.daemon_version,
                "protocol_version": s.protocol_version,
            }
            for s in result.statuses
        ],
    }
