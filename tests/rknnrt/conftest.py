from __future__ import annotations

from pathlib import Path

import pytest

from tests.rknnrt.stub_build import build_stub


@pytest.fixture(scope="session")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stub-rt"))


@pytest.fixture(scope="session")
def stub_mrt_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stub-mrt"), mrt=True)
