"""Fixtures for the deployment-file checks."""

from __future__ import annotations

import pytest
from deploy_files import DEPLOY, Dockerfile, parse_dockerfile


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return parse_dockerfile((DEPLOY / "Dockerfile").read_text())
