"""The toolkit's log lines: `<L> <api>: <message>` with L in I/W/E/D.

Errors and warnings always print (scripts rely on seeing why a call returned -1); info and debug
print when `verbose` is set. With `verbose_file`, every line also goes to that file.
"""

from __future__ import annotations

import sys
from pathlib import Path


class ToolkitLog:
    def __init__(self, verbose: bool | str = False, verbose_file: str | None = None) -> None:
        self.verbose = bool(verbose)
        self.debug = verbose == "debug"
        self._file: Path | None = None
        if verbose_file and self.verbose:
            path = Path(verbose_file)
            if path.parent.is_dir():
                self._file = path

    def _emit(self, level: str, api: str, message: str, show: bool) -> None:
        lines = [
            f"{level} {api}: {line}" if api else f"{level} {line}"
            for line in str(message).splitlines() or [""]
        ]
        text = "\n".join(lines)
        if show:
            print(text, file=sys.stderr if level == "E" else sys.stdout, flush=True)
        if self._file is not None:
            with self._file.open("a") as fh:
                fh.write(text + "\n")

    def i(self, api: str, message: str) -> None:
        self._emit("I", api, message, self.verbose)

    def d(self, api: str, message: str) -> None:
        self._emit("D", api, message, self.debug)

    def w(self, api: str, message: str) -> None:
        self._emit("W", api, message, True)

    def e(self, api: str, message: str) -> None:
        self._emit("E", api, message, True)
