"""The toolkit's log lines: `<L> <api>: <message>` with L in I/W/E/D.

Errors and warnings always print (scripts rely on seeing why a call returned -1); info and debug
print when `verbose` is set, except the few info lines every user must see (`say`). With `verbose_file`, every line also goes to that file.

During a toolkit call (`captured`), what libraries underneath say lands here too, at its own level:
Python logging records (ONNX Runtime's quantizer logs `WARNING:root:...` through the root logger) and
Python warnings. The root logger's own handlers are set aside for the call, so nothing prints raw.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


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

    def say(self, api: str, message: str) -> None:
        """An info line shown whatever `verbose` says: what a script's user must see (where results
        went, which model actually runs), as the toolkit's own unconditional `I` lines."""
        self._emit("I", api, message, True)

    def d(self, api: str, message: str) -> None:
        self._emit("D", api, message, self.debug)

    def w(self, api: str, message: str) -> None:
        self._emit("W", api, message, True)

    def e(self, api: str, message: str) -> None:
        self._emit("E", api, message, True)

    @contextmanager
    def captured(self, api: str) -> Iterator[None]:
        """Route logging records and Python warnings raised during one call into this log."""
        root = logging.getLogger()
        saved = root.handlers[:]
        handler = _RecordsToLog(self, api)
        root.handlers = [handler]
        with warnings.catch_warnings():  # the filters stay as the user set them; only the output moves
            warnings.showwarning = self._show_warning(api)
            try:
                yield
            finally:
                root.handlers = saved

    def _show_warning(self, api: str) -> Any:
        def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
            self.w(api, f"{category.__name__}: {message}")

        return show


class _RecordsToLog(logging.Handler):
    """A logging handler writing each record as a toolkit line of the matching level."""

    def __init__(self, log: ToolkitLog, api: str) -> None:
        super().__init__(logging.DEBUG)
        self._log, self._api = log, api

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            text = str(record.msg)
        if record.levelno >= logging.ERROR:
            self._log.e(self._api, text)
        elif record.levelno >= logging.WARNING:
            self._log.w(self._api, text)
        elif record.levelno >= logging.INFO:
            self._log.i(self._api, text)
        else:
            self._log.d(self._api, text)
