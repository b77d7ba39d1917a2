"""rknn-client deploy against an emulated board whose python3 is this machine's base Python.

The bundle holds this project's wheel (built here, no network) and pip's own wheel; the board finds the
dependencies (grpcio...) on a PYTHONPATH made of this interpreter's installed packages.
"""

from __future__ import annotations

import ensurepip
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rknn_client import __version__
from rknn_client.boards.shell import BoardShell
from rknn_client.cli import main
from rknn_client.deploy.board import BoardFacts, DeployRefused
from rknn_client.deploy.bundle import Bundle, BundleBuilder, download_command, only
from rknn_client.deploy.install import (
    INSTALL_DIR,
    PID_FILE,
    TOOLKIT_LAUNCHER,
    _answers,
    _install_launcher,
    deploy,
)
from rknn_client.device import Device
from rknn_client.transport.adb import connect_adb_server, open_adb
from rknn_client.transport.security import ENV_TOKEN
from tests.adb.conftest import MakeBoard
from tests.adb.fixtures import EmulatedBoard
from tests.conftest import DaemonFactory

ROOT = Path(__file__).resolve().parents[2]
# The checkout itself, not an installed copy: the board must get its daemon from the bundle only.
_OWN = ("rknn", "__editable__", "_rknn", "__pycache__")


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(folder)]
    subprocess.run([*command, str(ROOT)], check=True, capture_output=True, timeout=300)
    return only(folder, "rknn_server_oss-*.whl")


@pytest.fixture(scope="session")
def dependencies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This interpreter's installed packages, minus this project, as one folder for PYTHONPATH."""
    folder = tmp_path_factory.mktemp("deps")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(_OWN) and entry.suffix != ".pth":
            (folder / entry.name).symlink_to(entry)
    return folder


def local_builder(project_wheel: Path) -> BundleBuilder:
    def build(facts: BoardFacts, dest: Path) -> Bundle:
        (dest / project_wheel.name).write_bytes(project_wheel.read_bytes())
        pip_wheel = only(Path(ensurepip.__file__).parent / "_bundled", "pip-*.whl")
        (dest / pip_wheel.name).write_bytes(pip_wheel.read_bytes())
        return Bundle(dest, __version__, project_wheel.name, pip_wheel.name, with_dependencies=False)

    return build


@pytest.fixture
def python_board(make_board: MakeBoard, dependencies: Path) -> Iterator[EmulatedBoard]:
    """A board whose python3 is this machine's base interpreter (the one the tests' venv was made from)."""
    base = getattr(sys, "_base_executable", sys.executable)
    board = make_board(commands={"python3": f'"{base}" "$@"'}, env={"PYTHONPATH": str(dependencies)})
    yield board
    pid_file = board.profile.local_path(PID_FILE)
    if pid_file.exists():
        stop(int(pid_file.read_text()))


def stop(pid: int) -> None:
    """Stop a daemon deploy started (not our child: it runs in its own session)."""
    try:
        process = psutil.Process(pid)
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        process.kill()


def test_deploy_installs_starts_verifies_and_then_only_verifies(
    python_board: EmulatedBoard, project_wheel: Path
) -> None:
    socket_name = f"rknn-deploy-{uuid.uuid4().hex[:12]}"
    scripts = python_board.profile.local_path("/usr/bin/start_rknn.sh")
    scripts.parent.mkdir(parents=True)
    scripts.write_text("#!/bin/sh\nkillall rknn_server\n")
    builder = local_builder(project_wheel)
    first = deploy(python_board.serial, socket_name=socket_name, builder=builder)
    venv = python_board.profile.local_path(INSTALL_DIR)
    assert (venv / "bin" / "python").exists()
    assert list(venv.glob(f"lib/python3*/site-packages/rknn_server_oss-{__version__}.dist-info"))
    assert any("installed" in action for action in first.actions)
    assert any("start_rknn.sh" in note and "killall" in note for note in first.notes)
    pid = int(python_board.profile.local_path(PID_FILE).read_text())
    assert psutil.pid_exists(pid)
    with Device(open_adb(python_board.serial, socket_name=socket_name)) as device:
        assert device.handshake(10).daemon_version == __version__

    second = deploy(python_board.serial, socket_name=socket_name, builder=builder)
    assert second.actions == []
    assert "already installed and running" in second.report()
    assert int(python_board.profile.local_path(PID_FILE).read_text()) == pid

    # RKNN-Toolkit2 runs /usr/bin/rknn_server when ps shows none: that path starts this daemon.
    assert any(TOOLKIT_LAUNCHER in action for action in first.actions)
    shell = BoardShell(connect_adb_server(start=True).device(python_board.serial))
    shown = shell.run(f"{TOOLKIT_LAUNCHER} --help", timeout=120)
    assert shown.ok and "--legacy-listen" in shown.output, shown.output
    # A file there that is not the launcher (the vendor's daemon) is never overwritten.
    vendor = b"\x7fELF the vendor's rknn_server"
    launcher = python_board.profile.local_path(TOOLKIT_LAUNCHER)
    launcher.write_bytes(vendor)
    assert "left as it is" in _install_launcher(shell)
    assert launcher.read_bytes() == vendor


def test_no_python3_is_refused_with_the_container_alternative(make_board: MakeBoard) -> None:
    board = make_board(commands={"python3": "return 127"})
    with pytest.raises(DeployRefused) as raised:
        deploy(board.serial)
    assert "has no python3" in raised.value.problem and "docker compose" in raised.value.fix
    assert not board.profile.local_path(INSTALL_DIR).exists()


def test_armhf_without_the_distributions_numpy_is_refused_naming_it(
    make_board: MakeBoard, capsys: pytest.CaptureFixture[str]
) -> None:
    board = make_board(commands={"uname": "echo armv7l", "python3": 'echo "3.11 glibc 2.36"'})
    assert main(["deploy", "--device", board.serial]) == 1
    err = capsys.readouterr().err
    assert "armv7l" in err and "no numpy" in err and "apt install python3-numpy" in err


def test_armhf_with_an_old_glibc_is_refused_naming_grpcio(make_board: MakeBoard) -> None:
    board = make_board(commands={"uname": "echo armv7l", "python3": 'echo "3.11 glibc 2.31 numpy"'})
    with pytest.raises(DeployRefused) as raised:
        deploy(board.serial)
    assert "grpcio" in raised.value.problem and "glibc >= 2.34" in raised.value.problem


def test_waiting_for_the_daemon_stops_when_it_has_died() -> None:
    started = time.monotonic()
    assert not _answers("no-such-serial", "rknn-none", None, once=False, alive=lambda: False)
    assert time.monotonic() - started < 30


def test_android_is_refused(make_board: MakeBoard) -> None:
    board = make_board(props={"ro.build.version.sdk": "33"})
    with pytest.raises(DeployRefused) as raised:
        deploy(board.serial)
    assert "Android" in raised.value.problem and "rknn_server_oss.rc" in raised.value.fix


def test_the_download_targets_the_board_not_this_pc(tmp_path: Path) -> None:
    facts = BoardFacts("s", "aarch64", False, (3, 11), "glibc", "2.31", "", None)
    command = download_command(facts, tmp_path, ["pip", "grpcio>=1.85"])
    assert command[command.index("--python-version") + 1] == "3.11"
    assert command[command.index("--abi") + 1] == "cp311"
    platforms = [command[i + 1] for i, word in enumerate(command) if word == "--platform"]
    assert platforms[0] == "manylinux_2_31_aarch64" and "manylinux_2_17_aarch64" in platforms
    assert "manylinux_2_32_aarch64" not in platforms and "manylinux2014_aarch64" in platforms
    assert "--only-binary=:all:" in command and "--no-deps" in command
    assert command[-2:] == ["pip", "grpcio>=1.85"]


def test_deploy_asks_a_running_daemon_with_the_token_and_never_replaces_one_that_refuses(
    make_board: MakeBoard,
    make_daemon: DaemonFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """This version already installed and running with a token file: deploy only verifies it, with
    --token or RKNN_SERVER_TOKEN; without the token it refuses and leaves the daemon running (it
    used to take the refusal for a dead daemon, kill it and start one without a token)."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-deploy-token\n")
    token_file.chmod(0o600)
    socket_name = f"rknn-deploy-{uuid.uuid4().hex[:12]}"
    daemon = make_daemon("--auth-token-file", str(token_file), "--listen", f"unix-abstract:{socket_name}")
    board = make_board(commands={"uname": "echo aarch64", "python3": 'echo "3.11 glibc 2.36"'})
    dist_info = f"{INSTALL_DIR}/lib/python3.11/site-packages/rknn_server_oss-{__version__}.dist-info"
    board.profile.local_path(dist_info).mkdir(parents=True)
    board.profile.local_path(PID_FILE).write_text(f"{daemon.process.pid}\n")
    monkeypatch.delenv(ENV_TOKEN, raising=False)

    with pytest.raises(DeployRefused) as refused:
        deploy(board.serial, socket_name=socket_name)
    assert "refused this client's credentials" in refused.value.problem
    assert "UNAUTHENTICATED" in refused.value.problem and ENV_TOKEN in refused.value.fix
    assert daemon.process.poll() is None, "deploy stopped a daemon it could not ask"

    command = ["deploy", "--device", board.serial, "--socket", socket_name]
    assert main([*command, "--token", "s3cret-deploy-token"]) == 0
    assert "already installed and running" in capsys.readouterr().out
    monkeypatch.setenv(ENV_TOKEN, "s3cret-deploy-token")
    assert main(command) == 0
    assert "already installed and running" in capsys.readouterr().out
    assert daemon.process.poll() is None
