"""Daemon options from the command line, RKNN_SERVER_* environment variables and a TOML file.

Containers and service units configure through the environment or a file rather than a long command
line. Every long option of the parser takes part with no extra code: `--cache-quota` is the config-file
key `cache-quota` and the variable RKNN_SERVER_CACHE_QUOTA. Precedence: command line, then environment,
then file, then the parser's default. Values from the environment and the file go through the option's
own type and choices, so a bad one is refused like a bad flag, naming where it came from.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rknn_server.config.sizes import format_size, parse_size

ENV_PREFIX = "RKNN_SERVER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# RKNN_SERVER_* names that belong to others and that the daemon leaves alone: the client's token and
# CA (`rknn-client`, `rknn_server health`) and the SysV script's binary path.
FOREIGN_ENV = frozenset({"RKNN_SERVER_TOKEN", "RKNN_SERVER_TLS_CA", "RKNN_SERVER_BIN"})
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class OptionError(ValueError):
    """A setting the daemon cannot use; the message names the option, its source and what is expected."""


class Repeat(argparse.Action):
    """`append`, except that the first use on the command line replaces the default (which may come
    from the environment or the file) instead of adding to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or items is self.default else list(items)
        items.append(values)
        setattr(namespace, self.dest, items)


YEAR_S = 365 * 86400.0  # the longest time any option takes
Kind = Literal["count", "size", "seconds"]
_NOUN = {"count": "an integer", "size": "a size", "seconds": "a number of seconds"}
_PARSE: dict[Kind, Callable[[str], int | float]] = {"count": int, "size": parse_size, "seconds": float}


@dataclass(frozen=True)
class Bounded:
    """argparse type of a number from `low` to `high` (both included). A flag, a variable and a config-file
    key all parse through it, so each out-of-range value is refused alike, naming the range, before the
    daemon starts anything: nonsense such as -1 sessions or a 100 GiB gRPC message never reaches it."""

    kind: Kind
    low: float
    high: float

    def __call__(self, text: str) -> int | float:
        try:
            value = _PARSE[self.kind](text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {_NOUN[self.kind]}; {self.expected()}"
            ) from None
        if not self.low <= value <= self.high:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; {self.expected()}")
        return value

    def show(self, value: float) -> str:
        """A value as --help and errors write it: `16 GiB`, `30 s`, `64`."""
        if self.kind == "size":
            return format_size(int(value))
        if self.kind == "seconds":
            return f"{int(value)} s" if float(value).is_integer() else f"{value:g} s"
        return str(value)

    def expected(self) -> str:
        what = (
            "bytes or a number with a unit, e.g. 512MiB or 2GiB," if self.kind == "size" else _NOUN[self.kind]
        )
        return f"expected {what} from {self.show(self.low)} to {self.show(self.high)}"


def env_name(option: str) -> str:
    """The environment variable of a long option: `--cache-quota` -> RKNN_SERVER_CACHE_QUOTA."""
    return ENV_PREFIX + option.removeprefix("--").replace("-", "_").upper()


def _is_switch(action: argparse.Action) -> bool:
    return action.nargs == 0 and action.const is True


def layered_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options that environment and file may set, by key (the long option without `--`)."""
    found = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.help == argparse.SUPPRESS or action.dest in ("help", "version", "config"):
            continue
        if action.nargs == 0 and not _is_switch(action):
            continue
        found[longs[0][2:]] = action
    return found


def _shown_default(action: argparse.Action) -> str:
    if _is_switch(action):
        return "off"
    value = action.default
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(action.type, Bounded) and isinstance(value, (int, float)):
        return action.type.show(value)
    if isinstance(value, float) and action.metavar == "S":
        return f"{value:g} s"
    return "none" if value is None else str(value)


def document(parser: argparse.ArgumentParser) -> None:
    """Append each option's default (unless its help already states one), range and variable to its help."""
    for action in layered_options(parser).values():
        text = action.help or ""
        variable = f"env {env_name(action.option_strings[-1])}"
        if isinstance(action.type, Bounded):
            low, high = action.type.show(action.type.low), action.type.show(action.type.high)
            variable = f"{low} to {high}; {variable}".replace("%", "%%")
        if "default" not in text:
            shown = _shown_default(action).replace("%", "%%")  # help text is a %-format
            text = f"{text} (default: {shown}; {variable})"
        elif text.endswith(")"):  # the help's own "(... default: ...)" takes the variable too
            text = f"{text[:-1]}; {variable})"
        else:
            text = f"{text} ({variable})"
        action.help = text.strip()


def _suggestion(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _expected(action: argparse.Action) -> str:
    if action.choices is not None:
        return "one of " + ", ".join(map(str, action.choices))
    kind = getattr(action.type, "__name__", "")
    return {"int": "an integer", "float": "a number"}.get(kind, "a value")


def _convert_one(action: argparse.Action, raw: object, where: str) -> object:
    option = action.option_strings[-1]
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise OptionError(f"{option} from {where}: {raw!r} is not {_expected(action)}")
    text = str(raw)
    try:
        value = action.type(text) if callable(action.type) else text
    except argparse.ArgumentTypeError as exc:
        raise OptionError(f"{option} from {where}: {exc}") from None
    except (TypeError, ValueError):
        raise OptionError(f"{option} from {where}: {text!r} is not {_expected(action)}") from None
    if action.choices is not None and value not in action.choices:
        raise OptionError(f"{option} from {where}: {text!r} is not {_expected(action)}")
    return value


def _convert(action: argparse.Action, raw: object, where: str) -> object:
    """A value from the environment or the file, checked as the command line would check it."""
    option = action.option_strings[-1]
    if _is_switch(action):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise OptionError(f"{option} from {where}: {raw!r} is not a switch; expected true or false (1 or 0)")
    if isinstance(action, Repeat):
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items:
            raise OptionError(
                f"{option} from {where}: expected a list of values (a comma list in a variable)"
            )
        return [
            _convert_one(action, item.strip() if isinstance(item, str) else item, where) for item in items
        ]
    return _convert_one(action, raw, where)


def read_config(path: Path) -> dict[str, object]:
    """The TOML file's keys and values (a flat table)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # board images with Python 3.10: the [server] extra installs tomli
        try:
            import tomli as tomllib
        except ImportError:
            raise OptionError(
                f"reading the config file {path} on Python 3.10 needs tomli: pip install tomli"
            ) from None
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise OptionError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"config file {path} is not valid TOML: {exc}") from None


def layered_defaults(
    parser: argparse.ArgumentParser, config: Path | None, environ: Mapping[str, str]
) -> dict[str, object]:
    """Parser destinations to values from the config file, overridden by the environment."""
    options = layered_options(parser)
    values: dict[str, object] = {}
    if config is not None:
        for key, raw in read_config(config).items():
            action = options.get(key.replace("_", "-"))
            if action is None:
                raise OptionError(f"{config}: unknown key {key!r}{_suggestion(key, options)}")
            values[action.dest] = _convert(action, raw, f"{config}:{key}")
    by_env = {env_name(key): action for key, action in options.items()}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in FOREIGN_ENV or name == CONFIG_ENV:
            continue
        action = by_env.get(name)
        if action is None:
            raise OptionError(f"unknown environment variable {name}{_suggestion(name, by_env)}")
        values[action.dest] = _convert(action, environ[name], f"${name}")
    return values


def _unknown_flag(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    first = extra[0]
    hint = _suggestion(first.split("=")[0], known) if first.startswith("--") else ""
    return f"unrecognized arguments: {' '.join(extra)}{hint}"


def parse_layered(
    parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """Parse argv over defaults from `--config FILE` (or $RKNN_SERVER_CONFIG) and the environment."""
    environ = os.environ if environ is None else environ
    early = argparse.ArgumentParser(prog=parser.prog, usage=parser.usage, add_help=False)
    early.add_argument("--config", type=Path)
    known, _ = early.parse_known_args(argv)
    config = known.config or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    try:
        parser.set_defaults(**layered_defaults(parser, config, environ))
    except OptionError as exc:
        parser.error(str(exc))
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.error(_unknown_flag(parser, extra))
    return args
