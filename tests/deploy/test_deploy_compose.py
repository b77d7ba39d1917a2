"""docker-compose.yml, read by the real Compose v2 parser: valid in each profile, the board facts hold."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_files import REPO, Dockerfile, find_compose

COMPOSE_FILE = REPO / "docker-compose.yml"


def compose(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, file: Path = COMPOSE_FILE
) -> subprocess.CompletedProcess[str]:
    """Runs `docker-compose` on the file with no `.env` and none of the caller's RKNN_* variables."""
    binary = find_compose()
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RKNN_", "COMPOSE_"))}
    clean.update(env or {})
    command = [binary, "--project-directory", str(REPO), "--env-file", str(empty_env_file), "-f", str(file)]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=clean, check=False)


def resolved(tmp_path: Path, *profiles: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = compose(tmp_path, *flags, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def test_profiles_are_board_default_and_host(tmp_path: Path) -> None:
    result = compose(tmp_path, "config", "--profiles")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["host"]


@pytest.mark.parametrize("profiles", [(), ("host",)], ids=["default", "host"])
def test_config_is_valid(tmp_path: Path, profiles: tuple[str, ...]) -> None:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = compose(tmp_path, *flags, "config", "-q")
    assert result.returncode == 0, result.stderr


def test_parser_rejects_an_unknown_key(tmp_path: Path) -> None:
    """Guards the validity test: the parser must check the schema, not just read YAML."""
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(
        COMPOSE_FILE.read_text().replace("  restart: unless-stopped", "  restartt: unless-stopped")
    )
    result = compose(tmp_path, "config", "-q", file=bad)
    assert result.returncode != 0
    assert "restartt" in result.stderr


def test_default_profile_runs_only_the_board(tmp_path: Path) -> None:
    assert set(resolved(tmp_path)["services"]) == {"board"}
    assert set(resolved(tmp_path, "host")["services"]) == {"board", "host"}


def test_board_maps_npu_soc_id_and_runtime_read_only(tmp_path: Path) -> None:
    board = resolved(tmp_path)["services"]["board"]
    assert not board.get("privileged", False)
    assert [(d["source"], d["target"]) for d in board["devices"]] == [("/dev/dri/renderD129",) * 2]
    binds = {v["target"]: v for v in board["volumes"] if v["type"] == "bind"}
    assert binds["/proc/device-tree/compatible"]["source"] == "/proc/device-tree/compatible"
    assert binds["/usr/lib/librknnrt.so"]["source"] == "/usr/lib/librknnrt.so"
    assert all(v["read_only"] for v in binds.values())
    assert board["group_add"] == ["video"]


def test_board_paths_follow_the_variables(tmp_path: Path) -> None:
    env = {
        "RKNN_NPU_DEVICE": "/dev/rknpu",
        "RKNN_RUNTIME_LIB": "/oem/usr/lib/librknnmrt.so",
        "RKNN_NPU_GID": "106",
        "RKNN_PORT": "6000",
    }
    board = resolved(tmp_path, env=env)["services"]["board"]
    assert [(d["source"], d["target"]) for d in board["devices"]] == [("/dev/rknpu",) * 2]
    binds = {v["target"]: v["source"] for v in board["volumes"] if v["type"] == "bind"}
    assert binds["/usr/lib/librknnrt.so"] == "/oem/usr/lib/librknnmrt.so"
    assert board["group_add"] == ["106"]
    assert [(p["published"], p["target"]) for p in board["ports"]] == [("6000", 50515)]


def settings(service: dict[str, Any], dockerfile: Dockerfile, flavor: str) -> dict[str, str]:
    """The daemon's RKNN_SERVER_* settings in a service: the image's, then the service's `environment:`."""
    image = {
        k: v for k, v in dockerfile.environment(dockerfile.stage(flavor)).items() if k.startswith("RKNN_")
    }
    return {**image, **(service.get("environment") or {})}


def test_board_listens_on_tcp_with_auth_from_a_secret(tmp_path: Path, dockerfile: Dockerfile) -> None:
    config = resolved(tmp_path)
    board = config["services"]["board"]
    daemon = settings(board, dockerfile, "board")
    assert daemon["RKNN_SERVER_LISTEN"] == "tcp://0.0.0.0:50515"
    assert daemon["RKNN_SERVER_RUNTIME"] == "rknnrt"
    [secret] = board["secrets"]
    assert daemon["RKNN_SERVER_AUTH_TOKEN_FILE"] == f"/run/secrets/{secret['source']}"
    assert config["secrets"][secret["source"]]["file"] == str(REPO / "deploy/secrets/auth-token")
    assert [p["target"] for p in board["ports"]] == [50515]


def test_board_keeps_models_on_a_named_volume_and_restarts(tmp_path: Path, dockerfile: Dockerfile) -> None:
    config = resolved(tmp_path)
    board = config["services"]["board"]
    [cache] = [v for v in board["volumes"] if v["target"] == "/var/cache/rknn_server"]
    assert cache["type"] == "volume"
    assert cache["source"] in config["volumes"]
    assert settings(board, dockerfile, "board")["RKNN_SERVER_MODEL_CACHE"] == "/var/cache/rknn_server"
    assert board["restart"] == "unless-stopped"


def test_host_profile_needs_no_npu(tmp_path: Path) -> None:
    host = resolved(tmp_path, "host")["services"]["host"]
    assert host["profiles"] == ["host"]
    assert "devices" not in host
    assert all(v["type"] == "volume" for v in host["volumes"])
    assert host["build"]["args"] == {"FLAVOR": "host"}
    assert [p["host_ip"] for p in host["ports"]] == ["127.0.0.1"]


def test_board_runs_the_board_image_cmd_with_its_token_secret(tmp_path: Path, dockerfile: Dockerfile) -> None:
    board = resolved(tmp_path)["services"]["board"]
    assert board["build"]["args"] == {"FLAVOR": "board"}
    assert board.get("command") is None, "the image's CMD and variables configure the daemon"
    assert settings(board, dockerfile, "board")["RKNN_SERVER_AUTH_TOKEN_FILE"] == "/run/secrets/auth-token"
    assert [s["source"] for s in board["secrets"]] == ["auth-token"]
