"""Plugins run inside the daemon: only files nobody else can change are loaded, and what was checked
is what gets loaded (issue 12, item 9)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

import rknn_client
from rknn_client.errors import RknnError
from rknn_server.runtime.rknnrt import plugins
from rknn_server.runtime.rknnrt.plugins import Plugin, load_plugins
from tests.rknnrt.fake_sysfs import rk3588_board
from tests.rknnrt.stub_build import build_plugin, write_stub_model
from tests.rknnrt_cases import start_rknnrt_daemon

FOREIGN_UID = 54321  # neither root nor the test's user


def _op_type(plugin: Plugin) -> str:
    """The op_type of the plugin's rknn_custom_op (after its two 32-bit fields)."""
    return ctypes.string_at(plugin.op + 8).decode()


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    return folder


def test_a_good_plugin_loads(plugin_dir: Path) -> None:
    build_plugin(plugin_dir, "librkcst_good.so", "Good")
    assert [_op_type(p) for p in load_plugins(plugin_dir)] == ["Good"]


def test_a_group_writable_plugin_is_refused(plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    build_plugin(plugin_dir, "librkcst_good.so", "Good")
    build_plugin(plugin_dir, "librkcst_group.so", "Group").chmod(0o775)
    assert [_op_type(p) for p in load_plugins(plugin_dir)] == ["Good"]
    assert "librkcst_group.so: the file is writable by its group" in caplog.text


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_plugins_in_a_directory_others_can_write_are_refused(
    plugin_dir: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    build_plugin(plugin_dir, "librkcst_good.so", "Good")
    plugin_dir.chmod(mode)
    assert load_plugins(plugin_dir) == ()
    assert "the plugin directory is writable by" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_plugins_in_a_directory_of_another_user_are_refused(
    plugin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    build_plugin(plugin_dir, "librkcst_good.so", "Good")
    os.chown(plugin_dir, FOREIGN_UID, -1)
    assert load_plugins(plugin_dir) == ()
    assert f"the plugin directory is owned by uid {FOREIGN_UID}" in caplog.text


def test_a_link_is_refused_even_to_a_good_plugin(
    plugin_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = build_plugin(tmp_path, "librkcst_elsewhere.so", "Elsewhere")
    (plugin_dir / "librkcst_link.so").symlink_to(good)
    assert load_plugins(plugin_dir) == ()
    assert "librkcst_link.so: it is a symbolic link" in caplog.text


def test_the_checked_file_is_the_loaded_one_when_the_path_is_swapped(
    plugin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path is replaced (by a file the checks would also pass) after the check, just before the
    library is loaded: the daemon still runs the file it checked, never the swapped-in one."""
    path = build_plugin(plugin_dir, "librkcst_swapped.so", "Checked")
    staging = tmp_path / "staging"
    staging.mkdir()
    evil = build_plugin(staging, "evil.so", "Swapped")
    real_cdll = ctypes.CDLL
    swaps: list[str] = []

    def swap_then_load(name: str, *args: object, **kwargs: object) -> ctypes.CDLL:
        if not swaps:
            os.replace(evil, path)
            swaps.append(name)
        return real_cdll(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plugins.ctypes, "CDLL", swap_then_load)
    loaded = load_plugins(plugin_dir)
    assert swaps, "the loader never reached the library load"
    assert [_op_type(p) for p in loaded] == ["Checked"]
    assert path.read_bytes() != b"" and not evil.exists()  # the swap did happen on disk


def test_a_daemon_registers_only_the_plugins_nobody_else_can_change(
    stub_lib: Path, plugin_dir: Path, tmp_path: Path
) -> None:
    build_plugin(plugin_dir, "librkcst_good.so", "Good")
    build_plugin(plugin_dir, "librkcst_group.so", "Group").chmod(0o775)
    x = np.ones((1, 2, 2, 3), np.float32)
    daemon = start_rknnrt_daemon(
        tmp_path / "daemon", stub_lib, rk3588_board(tmp_path / "board"), "--plugin-dir", str(plugin_dir)
    )
    try:
        with rknn_client.connect(daemon.url) as device:
            with device.load(write_stub_model(tmp_path / "good.rknn", requires_op="Good")) as session:
                np.testing.assert_allclose(session.run([x])[0], 3.0)  # the stub's 2 * x + 1
            group_model = write_stub_model(tmp_path / "group.rknn", requires_op="Group")
            with (
                device.load(group_model) as session,
                pytest.raises(RknnError, match="RKNN_ERR_MODEL_INVALID"),
            ):
                session.run([x])
    finally:
        daemon.stop()
    assert "librkcst_group.so: the file is writable by its group" in daemon.log_text()
