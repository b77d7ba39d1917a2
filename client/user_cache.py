"""Where rknn_client keeps what it remembers for the user: `$XDG_CACHE_HOME/rknn_client`, else
`~/.cache/rknn_client` (what platformdirs gives on Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rknn_client"
