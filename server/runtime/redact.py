"""Server paths out of the text a client reads.

Runtimes (ONNX Runtime, Python's own OSError) put absolute paths in their messages: the cache's
location, the working directory, whether some file exists. A client needs what went wrong, not where
the daemon keeps things, so each absolute path is cut to its last component (the client's own file
name, where it is one); the full text stays in the daemon's log.
"""

from __future__ import annotations

import re

# An absolute path: a "/" that does not continue a word, a URL scheme ("tcp://") or another path.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/\\])/[^\s\"'(),;:<>\[\]{}|]+")


def _last_component(match: re.Match[str]) -> str:
    parts = [p for p in match.group(0).split("/") if p]
    return parts[-1] if parts else "/"


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last component."""
    return _ABSOLUTE_PATH.sub(_last_component, text)
