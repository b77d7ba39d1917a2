"""The `rknn-client` commands that look after boards rather than run models: devices, doctor, deploy.

They do not connect to one daemon first (the board may have none yet), so each runs on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from rknn_client.boards.devices import adb_problem, devices_table, survey
from rknn_client.boards.doctor import diagnose, format_report
from rknn_client.cli.parser import add_json_option
from rknn_client.transport.base import TransportError
from rknn_client.transport.security import ENV_TOKEN
from rknn_proto.version import DEFAULT_ABSTRACT_SOCKET

Command = Callable[[argparse.Namespace], int]


def cmd_devices(args: argparse.Namespace) -> int:
    rows = survey(args.device or (), socket_name=args.socket, token=args.token)
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in rows], indent=2))
    else:
        print(devices_table(rows, adb_problem() if not rows else ""), end="")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = diagnose(args.device, socket_name=args.socket, token=args.token)
    healthy = bool(checks) and all(check.ok or not check.blocking for check in checks)
    if args.json:
        print(json.dumps({"ok": healthy, "checks": [dataclasses.asdict(c) for c in checks]}, indent=2))
    else:
        print(format_report(checks))
    return 0 if healthy else 1


def cmd_deploy(args: argparse.Namespace) -> int:
    from rknn_client.deploy.board import DeployError
    from rknn_client.deploy.install import deploy

    def progress(step: str) -> None:
        print(f"deploy: {step}", file=sys.stderr)

    try:
        print(deploy(args.device, socket_name=args.socket, progress=progress, token=args.token).report())
    except (DeployError, TransportError) as error:
        print(f"rknn-client deploy: {error}", file=sys.stderr)
        return 1
    return 0


def add_token_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--token",
        help=f"the daemon's bearer token (default: {ENV_TOKEN}; prefer the variable: other users "
        "of this machine can read a command line)",
    )


def add_board_commands(sub: Any) -> None:
    """Add the board commands to rknn-client's subparsers; each stores its function as `standalone`."""

    def add(name: str, fn: Command, help_text: str) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument(
            "--socket",
            default=DEFAULT_ABSTRACT_SOCKET,
            help="the daemon's abstract socket on the board (default: %(default)s)",
        )
        command.set_defaults(standalone=fn)
        return command

    devices = add("devices", cmd_devices, "list boards: SoC, model, whether the daemon answers, versions")
    devices.add_argument("--device", action="append", help="also probe this tcp://HOST:PORT (repeatable)")
    add_token_option(devices)
    add_json_option(devices)
    doctor = add(
        "doctor", cmd_doctor, "check every link from this PC to the board's NPU; exit 0 when all hold"
    )
    doctor.add_argument(
        "--device", help="adb serial, IP:PORT or tcp://HOST:PORT (default: the single adb board)"
    )
    add_token_option(doctor)
    add_json_option(doctor)
    deploy = add(
        "deploy",
        cmd_deploy,
        "install or upgrade this version's daemon on an adb board (offline: wheels built here) and start it",
    )
    deploy.add_argument("--device", help="adb serial or IP:PORT (default: the single adb board)")
    add_token_option(deploy)
