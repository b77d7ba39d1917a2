"""Every difference between two sessions' transcripts and toolkit results, less the allowed ones.

Units are paired per connection and direction in order (the toolkit is the same on both sides, so
its requests come in the same order); each pair's decoded fields are compared and a difference
reads `SESSION connN DIR#I KIND.FIELD: real=... ours=...`. A difference is allowed when its key
`DIR.KIND.FIELD` (or `result.STEP` for the toolkit-visible results) matches an entry of
allow.toml, each of which says why the difference is right or harmless.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from tools.legacy_compare.decode import Unit, decode, mask_times

ALLOW_LIST = Path(__file__).with_name("allow.toml")


@dataclass(frozen=True)
class Allowance:
    key: str  # an fnmatch pattern of DIR.KIND.FIELD or result.STEP
    sessions: tuple[str, ...]  # empty: every session
    why: str


@dataclass(frozen=True)
class Difference:
    session: str
    where: str
    key: str
    real: Any
    ours: Any

    def __str__(self) -> str:
        return f"{self.session} {self.where} {self.key}: real={_short(self.real)} ours={_short(self.ours)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def load_allow_list(path: Path = ALLOW_LIST) -> list[Allowance]:
    entries = tomllib.loads(path.read_text()).get("allow", [])
    return [Allowance(e["key"], tuple(e.get("sessions", ())), e["why"]) for e in entries]


def allowance_for(difference: Difference, allowed: list[Allowance]) -> Allowance | None:
    for entry in allowed:
        if fnmatch.fnmatchcase(difference.key, entry.key) and (
            not entry.sessions or difference.session in entry.sessions
        ):
            return entry
    return None


def _streams(units: list[Unit]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """The decoded units of each connection (numbered from 1 in the session) and direction."""
    numbers: dict[int, int] = {}
    streams: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for unit in units:
        number = numbers.setdefault(unit.connection, len(numbers) + 1)
        stream = streams[(number, unit.direction)]
        stream.append(decode(unit, first=not stream))
    return streams


def _compare_fields(
    session: str, where: str, real: dict[str, Any], ours: dict[str, Any], prefix: str
) -> list[Difference]:
    out = []
    for name in sorted(set(real) | set(ours)):
        a, b = real.get(name, "<absent>"), ours.get(name, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _compare_fields(session, where, a, b, f"{prefix}.{name}")
        elif a != b:
            out.append(Difference(session, where, f"{prefix}.{name}", a, b))
    return out


def compare_messages(session: str, real: list[Unit], ours: list[Unit]) -> list[Difference]:
    left, right = _streams(real), _streams(ours)
    out = []
    for stream in sorted(set(left) | set(right)):
        conn, direction = stream
        a, b = left.get(stream, []), right.get(stream, [])
        if len(a) != len(b):
            kinds = ([u["kind"] for u in a], [u["kind"] for u in b])
            out.append(Difference(session, f"conn{conn} {direction}", f"{direction}.count", *kinds))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            kind = x["kind"] if x["kind"] == y["kind"] else f"{x['kind']}|{y['kind']}"
            out += _compare_fields(session, f"conn{conn} {direction}#{i}", x, y, f"{direction}.{kind}")
    return out


def _same_arrays(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def compare_results(session: str, real: dict[str, Any], ours: dict[str, Any]) -> list[Difference]:
    """What the script saw: each step's value, and the outputs (equal arrays, or a difference)."""
    out = []
    for step in sorted((set(real) | set(ours)) - {"stdout", "outputs", "inference_seconds"}):
        a, b = real.get(step, "<absent>"), ours.get(step, "<absent>")
        if step == "eval_perf" and isinstance(a, str) and isinstance(b, str):
            a, b = mask_times(a), mask_times(b)
        if a != b:
            out.append(Difference(session, "toolkit", f"result.{step}", a, b))
    a_out, b_out = real.get("outputs"), ours.get("outputs")
    if not _same_arrays(a_out, b_out):
        out.append(Difference(session, "toolkit", "result.outputs", a_out, b_out))
    return out
