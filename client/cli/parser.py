"""argparse the way people fix their typos: the reason first, a "did you mean" for a mistyped command or
option, then the usage line of the (sub)command that was given, not the whole top-level help."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import NoReturn

_CHOICE = re.compile(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)")


def _close(word: str, candidates: list[str]) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """` (did you mean X?)` for a mistyped choice, command or option in argparse's `message`; else ''."""
    choice = _CHOICE.search(message)
    if choice and "maybe you meant" not in message:
        candidates = [c.strip(" '\"") for c in choice.group(2).split(",")]
        best = _close(choice.group(1), candidates)
        return f" (did you mean {best}?)" if best else ""
    if message.startswith("unrecognized arguments:"):
        options = list(parser._option_string_actions)
        hints = []
        for word in message.removeprefix("unrecognized arguments:").split():
            best = _close(word.split("=", 1)[0], options) if word.startswith("-") else None
            if best:
                hints.append(f"{best} instead of {word}")
        return f" (did you mean {', '.join(hints)}?)" if hints else ""
    return ""


class Parser(argparse.ArgumentParser):
    """Subcommands made with add_subparsers() are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"{self.prog}: error: {message}{suggestion(self, message)}\n"
            f"{self.format_usage()}Run `{self.prog} --help` for every option.\n",
        )


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)command parser that `args` came from, so it can report its own errors."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and action.dest != argparse.SUPPRESS:
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return chosen_parser(action.choices[name], args)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that arguments nobody knows are reported by the subcommand they followed,
    and a command's `check_options` default (args -> what is wrong, or None) judges how its options combine."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    check = getattr(args, "check_options", None)
    problem = check(args) if check is not None else None
    if problem:
        chosen_parser(parser, args).error(problem)
    return args


def add_json_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--json", action="store_true", help="print one JSON document instead of text")
