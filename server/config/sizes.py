"""Sizes as people write them (flags, config files, messages) and the machine's memory: light, so the
option parser can use them without importing the daemon."""

from __future__ import annotations

import os
import re

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size written as bytes ("1048576") or with a unit ("512MiB", "2GiB", "1.5GB", "64k")."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a size; expected bytes or a number with a unit, e.g. 512MiB or 2GiB"
        )
    number, unit, binary = match.groups()
    unit = (unit or "").lower()
    scale = 1024 ** ("kmgt".index(unit) + 1) if unit and binary else _UNITS[unit]
    return int(float(number) * scale)


def format_size(size: int) -> str:
    """A byte count as people read it and parse_size takes back: `16 GiB`, `7.75 GiB`, `512 B`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.4g} {unit}"
        value /= 1024
    return f"{value:.4g} TiB"


def machine_ram() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
