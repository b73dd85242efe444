"""Byte sizes as people write them (64KiB, 16M) and as the project prints them: binary units."""

from __future__ import annotations

import re

from arxtune.runtime.errors import ArxtuneError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_bytes(value: int | str) -> int:
    """'64KiB', '16M', 4096 -> bytes (binary units)."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).upper() not in _UNITS:
        raise ArxtuneError(f"cannot read size {value!r}: use bytes or a unit like 64KiB, 16MiB")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_bytes(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes:.0f}B"
