"""Every limit the daemon enforces is in GetInfo with the value it was configured with, as the client
sees it (DeviceInfo.limits): a limit flag added without its wire field fails here, before a client
ever guesses a limit the daemon does not report."""

from __future__ import annotations

import argparse
from dataclasses import fields

from rknn_client import connect
from rknn_server.cli import serve_parser
from rknn_server.config.limits import Limits
from rknn_server.config.options import Bounded
from tests.reliability.conftest import StartDaemon

# Where the daemon's limit flags live; a `--max-*` flag in any other group counts too.
LIMIT_GROUPS = ("sessions and limits", "model cache")
# Flags of those groups that are settings, not limits.
NOT_LIMITS = {
    "--isolation",
    "--grace",
    "--model-cache",
    "--model-repository",
    "--verify-interval",
    "--verify-cache",
}


def limit_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    found = []
    for group in parser._action_groups:
        for action in group._group_actions:
            flag = action.option_strings[-1] if action.option_strings else ""
            limit_group = group.title in LIMIT_GROUPS and flag not in NOT_LIMITS
            if flag and (limit_group or flag.startswith("--max-")):
                found.append(action)
    return found


def unusual(action: argparse.Action) -> str:
    """A value of the flag that is not its default (the command line's text)."""
    default = action.default or 0
    assert isinstance(action.type, Bounded), f"{action.option_strings[-1]}: a limit flag without a range"
    step = {"size": 1 << 20, "count": 3, "seconds": 1.5}[action.type.kind]
    return str(default + step)


def test_every_limit_flag_is_reported_with_its_configured_value(daemons: StartDaemon) -> None:
    parser = serve_parser()
    actions = limit_flags(parser)
    declared = {f.name for f in fields(Limits)}
    unwired = [a.option_strings[-1] for a in actions if a.dest not in declared]
    assert not unwired, f"limit flags whose dest is no field of rknn_server.config.limits.Limits: {unwired}"
    assert {a.dest for a in actions} == declared, "a field of Limits that no limit flag sets"

    argv = ["--isolation", "process"]  # where --call-timeout is enforced
    for action in actions:
        argv += [action.option_strings[-1], unusual(action)]
    expected = parser.parse_args(argv)
    daemon = daemons(*argv)
    with connect(daemon.url) as device:
        reported = device.info().limits
    for action in actions:
        configured = getattr(expected, action.dest)
        assert configured != action.default, action.dest
        assert reported[action.dest] == configured, (
            f"{action.option_strings[-1]}: GetInfo says {reported[action.dest]}"
        )
