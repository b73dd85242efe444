"""Byte sizes as people write them (64KiB, 16M) and as the project prints them: binary units."""

from __future__ import annotations

import re

from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.schema import MAX_SIZE_BYTES

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


def parse_bytes(value: int | str) -> int:
    """'64KiB', '16M', 4096 -> bytes (binary units), at most MAX_SIZE_BYTES: the cap every file format has."""
    if isinstance(value, int):
        nbytes = value
    else:
        text = str(value)
        match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
        if not match or match.group(2).upper() not in _UNITS:
            shown = repr(text) if len(text) <= 40 else repr(text[:40]) + f" ({len(text)} characters)"
            raise ArxtuneError(f"cannot read size {shown}: use bytes or a unit like 64KiB, 16MiB")
        digits = match.group(1)
        nbytes = int(digits) * _UNITS[match.group(2).upper()] if len(digits) <= 20 else MAX_SIZE_BYTES + 1
    if nbytes > MAX_SIZE_BYTES:
        raise ArxtuneError(f"size {_short(value)} is above {format_bytes(MAX_SIZE_BYTES)}, the largest arxtune handles")
    return nbytes


def _short(value: int | str) -> str:
    """A size as given, cut to 40 characters (a number of 5000 digits must not fill the error line)."""
    text = str(value).strip() if isinstance(value, str) else (f"{value}" if abs(value) < 10**40 else "of more than 40 digits")
    return text if len(text) <= 40 else text[:37] + "..."


def format_bytes(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes:.0f}B"
