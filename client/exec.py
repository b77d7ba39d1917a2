"""`rknn-client exec script.py [args]` / `python -m rknn_client.exec script.py [args]`: run an unmodified
RKNN-Toolkit2 or rknn-toolkit-lite2 script with `rknn.api` and `rknnlite.api` answered by this project
(rknn_client.compat.aliases). The script runs as `__main__` with its own argv and its folder first on
sys.path, as `python script.py` would run it; the exit status is the script's.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from rknn_client.compat import aliases


def run_script(script: str, args: list[str]) -> int:
    path = Path(script)
    if not path.is_file():
        print(f"rknn-client exec: {script} does not exist", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    finder = aliases.install()
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return int(code or 0)
        print(code, file=sys.stderr)
        return 1
    finally:
        aliases.uninstall(finder)
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m rknn_client.exec script.py [args...]", file=sys.stderr)
        return 2
    return run_script(args[0], args[1:])


if __name__ == "__main__":
    sys.exit(main())
