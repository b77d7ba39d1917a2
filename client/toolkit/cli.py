"""`rknn-client toolkit install|status`: the real RKNN-Toolkit2 that the bridge drives."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rknn_client.toolkit.install import InstallError, install
from rknn_client.toolkit.locate import DEFAULT_VERSION, INSTALL_HINT, Missing, locate


def cmd_status(args: argparse.Namespace) -> int:
    found = locate(args.version)
    if isinstance(found, Missing):
        if args.json:
            print(json.dumps({"found": False, "reason": found.reason, "fix": INSTALL_HINT}))
        else:
            print("rknn-toolkit2: not found")
            print(f"why:           {found.reason}")
            print(f"fix:           {INSTALL_HINT}")
        return 1
    if args.json:
        print(json.dumps({"found": True, **{k: str(v) for k, v in asdict(found).items()}}))
    else:
        print(f"rknn-toolkit2: {found.version}")
        print(f"python:        {found.python} (Python {found.python_version})")
        print(f"found via:     {found.source}")
        print(f"torch:         {found.torch}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        install(
            args.version,
            wheelhouse=args.wheelhouse,
            torch_stub=args.torch_stub,
            python=args.python,
            force=args.force,
            say=say,
        )
    except InstallError as error:
        print(f"rknn-client toolkit install: {error}", file=sys.stderr)
        return 1
    return 0


def add_toolkit_commands(sub: Any) -> None:
    """Add `toolkit install` and `toolkit status` to rknn-client's subparsers (as `standalone` commands)."""
    toolkit = sub.add_parser(
        "toolkit",
        help="the real RKNN-Toolkit2 (converter, simulator) the RKNN class drives in its own venv",
        description="Find or install RKNN-Toolkit2 in a venv of its own (it cannot share ours: it pins "
        "protobuf 4 and numpy 1). RKNN_TOOLKIT2_PYTHON=/path/to/python selects another one.",
    )
    commands = toolkit.add_subparsers(dest="toolkit_command", required=True)
    status = commands.add_parser("status", help="what was found, its version and Python, or why not")
    status.add_argument("--version", help=f"a managed install of this version (default {DEFAULT_VERSION})")
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.set_defaults(standalone=cmd_status)
    inst = commands.add_parser("install", help="create the managed venv from PyPI (or a wheelhouse)")
    inst.add_argument(
        "--version", default=DEFAULT_VERSION, help="rknn-toolkit2 version (default %(default)s)"
    )
    inst.add_argument("--wheelhouse", type=Path, help="install offline from the wheels in this folder")
    inst.add_argument("--python", help="the Python to base the venv on (CPython 3.6-3.12; default: this one)")
    inst.add_argument("--force", action="store_true", help="reinstall even when it is already there")
    inst.add_argument(
        "--torch-stub",
        action="store_true",
        help="install rknn-client's stand-in for torch instead of PyPI's torch and its GBs of CUDA "
        "libraries (for tests and CI: everything but load_pytorch works)",
    )
    inst.set_defaults(standalone=cmd_install)
