"""tools/legacy_constants.py reads from the real librknn_api.so the same constants the daemon uses,
which were found by running the toolkit: adding a release is running the tool on its library. Every
installed toolkit release is checked against its entry in RELEASES."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from pathlib import Path

import pytest

from rknn_server.protocols.legacy.layouts import RELEASES
from tests.legacy.toolkit import Toolkit, installed_toolkits

TOOL = Path(__file__).parents[2] / "tools" / "legacy_constants.py"


INSTALLED = installed_toolkits()


@pytest.mark.parametrize(
    "toolkit",
    INSTALLED or [pytest.param(None, marks=pytest.mark.skip(reason="no toolkit installed"))],
    ids=[t.version for t in INSTALLED] or None,
)
def test_the_tool_extracts_each_releases_layout_from_its_library(toolkit: Toolkit) -> None:
    if shutil.which("objdump") is None:
        pytest.skip("binutils' objdump is not installed")
    if toolkit.version not in RELEASES:
        pytest.skip(f"toolkit {toolkit.version} has no layout to compare with")
    spec = importlib.util.spec_from_file_location("legacy_constants", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    found = tool.extract(toolkit.api_library)
    assert tool.release_version(toolkit.api_library) == toolkit.version
    known = dataclasses.asdict(RELEASES[toolkit.version])
    assert len(found) >= 23
    assert {name: known[name] for name in found} == found
