"""What a host load learns of a model from its ONNX graph, remembered beside the model in the
daemon's cache, so that a restarted daemon loads a model it has studied before without parsing its
graph or importing the onnx package (together about a tenth of a second for MobileNetV2 on a PC,
several times that on a board).

The facts are a function of the file's bytes, and the cache's files never change in place (a model
is content-addressed; a damaged one is removed whole), so the file's size, modification time and
inode are kept with them only to catch a file that did change (as the store's `.verified` record
does). Nothing here imports onnx."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

# Bump when what a study computes changes, so that facts of an older study are studied again.
FACTS_VERSION = 1


@dataclass(frozen=True)
class ModelFacts:
    """A model's memory figures and whether its runs are steady (host_study.facts_of)."""

    need: int  # bytes a load and a run materialize at least: the session budget's measure
    steady: bool  # no dynamic axis, no shape computed from the data: an arena keeps nothing a caller chose
    weight_bytes: int
    internal_bytes: int  # peak of live intermediates, for the memory report


def facts_path(model: Path) -> Path:
    """Where a model's facts are: a dot file beside it, which the cache's quota and checks pass over."""
    return model.with_name(f".{model.name}.host-facts.json")


def _stamp(model: Path) -> dict[str, int]:
    info = model.stat()
    return {
        "version": FACTS_VERSION,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "inode": info.st_ino,
    }


def recall(model: Path) -> ModelFacts | None:
    """The model's remembered facts, or None: none yet, of another study version, of a file that
    changed since, or unreadable (then the model is studied again and they are written anew)."""
    try:
        kept = json.loads(facts_path(model).read_text())
        if kept.get("stamp") != _stamp(model):
            return None
        values = kept["facts"]
        facts = ModelFacts(**{f.name: values[f.name] for f in fields(ModelFacts)})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    numbers = (facts.need, facts.weight_bytes, facts.internal_bytes)
    if not isinstance(facts.steady, bool) or not all(type(n) is int and n >= 0 for n in numbers):
        return None
    return facts


def remember(model: Path, facts: ModelFacts) -> None:
    """Write the facts beside the model (atomically: a reader sees the old file or the new, whole);
    best effort, for a load that cannot write them just studies the model again next time."""
    target = facts_path(model)
    staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        staged.write_text(json.dumps({"stamp": _stamp(model), "facts": asdict(facts)}))
        os.replace(staged, target)
    staged.unlink(missing_ok=True)
