"""The checks every file loader builds its typed schema from.

Each loader (thresholds here in the runtime; run meta, points, sweep config
and e2e result in the harness) reads a file only through `parse_json` (or
TOML) and these field checks, so malformed content of any kind (a wrong
type, a number too large or not finite, a name nobody knows, nesting deep
enough to exhaust the stack) is one FormatError naming the field, never a
TypeError, OverflowError, RecursionError or ValueError from deep inside.
Plain Python: the runtime's start-up cost stays where it was.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Iterable, TypeVar

from arxtune.runtime.errors import FormatError

#: An identifier, optionally with a variant's settings: base[key=value,...].
VARIANT_NAME = re.compile(r"[A-Za-z_]\w*(\[[\w.=,\-]+\])?")

#: Deepest nesting any arxtune file has is 5 (thresholds: backend_setup.NAME.options.KEY.[list]); room for options.
MAX_DEPTH = 16
#: Longest name, string field or list any arxtune file holds legitimately.
MAX_STRING = 4096
MAX_ITEMS = 100_000
#: Largest byte count a file may name: far above any device, far below where float arithmetic loses whole bytes.
MAX_SIZE_BYTES = 1 << 50
#: Largest world size, rank count or sample count a file may name.
MAX_COUNT = 1 << 31

T = TypeVar("T")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a file may hold")


def parse_json(text: str, source: str) -> Any:
    """JSON text -> Python values, or one FormatError: bad syntax, NaN/Infinity, huge integers, deep nesting."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{source} is not valid JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:  # an integer of too many digits, NaN, or nesting past the stack
        raise FormatError(f"{source} is not an arxtune file ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None
    check_depth(data, source)
    return data


def check_depth(data: Any, source: str, limit: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than `limit` (iteratively, so the check itself cannot recurse out)."""
    todo = [(data, 0)]
    while todo:
        value, depth = todo.pop()
        if depth > limit:
            raise FormatError(f"{source} nests deeper than {limit} levels; it is not an arxtune file")
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)


def _show(value: Any) -> str:
    """A short repr for messages, bounded whatever the value (a list 5000 deep, an integer of 5000 digits)."""
    if isinstance(value, (list, dict)):
        return f"{'a list' if isinstance(value, list) else 'an object'} of {len(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value[:40] if isinstance(value, str) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def table(value: Any, where: str) -> dict:
    """A JSON object / TOML table with string keys."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise FormatError(f"{where} must be an object, not {_show(value)}")
    if len(value) > MAX_ITEMS:
        raise FormatError(f"{where} has more than {MAX_ITEMS} entries")
    return value


def known_keys(value: dict, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    """The object must have every required key and no key outside required + optional."""
    required = tuple(required)
    missing = [k for k in required if k not in value]
    if missing:
        raise FormatError(f"{where} lacks {', '.join(missing)}")
    unknown = sorted(set(value) - set(required) - set(optional))
    if unknown:
        raise FormatError(f"{where} has unknown field(s) {', '.join(map(_show, unknown[:5]))}")
    return value


def string(value: Any, where: str, choices: Iterable[str] | None = None, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > MAX_STRING or (not empty and not value):
        raise FormatError(f"{where} must be {'a non-empty' if not empty else 'a'} string, not {_show(value)}")
    if choices is not None:
        choices = tuple(choices)
        if value not in choices:
            raise FormatError(f"{where} {_show(value)} is unknown; known: {', '.join(choices)}")
    return value


def optional_string(value: Any, where: str) -> str | None:
    return None if value is None else string(value, where)


def name(value: Any, where: str, choices: Iterable[str] | None = None) -> str:
    """A backend, op or other identifier: letters, digits and _ only; a backend variant adds its settings
    in brackets (nccl[proto=LL,channels=4]), and `choices` then names its base."""
    text = string(value, where)
    if not VARIANT_NAME.fullmatch(text):
        raise FormatError(f"{where} {_show(value)} is not a name")
    string(text.partition("[")[0], where, choices)
    return text


def integer(value: Any, where: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """A whole number (not a bool, not a float) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{where} must be a whole number, not {_show(value)}")
    if not lo <= value <= hi:
        raise FormatError(f"{where} {value if abs(value) < 1 << 64 else 'of ' + str(value.bit_length()) + ' bits'} is outside {lo}..{hi}")
    return value


def number(value: Any, where: str, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> float:
    """A finite number within [lo, hi] ((lo, hi] with lo_open); ints are taken as floats."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(f"{where} must be a number, not {_show(value)}")
    try:
        result = float(value)
    except OverflowError:
        raise FormatError(f"{where} is too large") from None
    if not math.isfinite(result) or result < lo or result > hi or (lo_open and result == lo):
        bound = f"above {lo:g}" if lo_open else f"at least {lo:g}"
        raise FormatError(
            f"{where} must be a finite number {bound}" + (f" and at most {hi:g}" if math.isfinite(hi) else "") + f", not {_show(value)}"
        )
    return result


def optional_number(value: Any, where: str, **bounds) -> float | None:
    return None if value is None else number(value, where, **bounds)


def items(value: Any, where: str, each: Callable[[Any, str], T], max_items: int = MAX_ITEMS) -> tuple[T, ...]:
    """A list, each item checked by `each(item, 'where[i]')`."""
    if not isinstance(value, list):
        raise FormatError(f"{where} must be a list, not {_show(value)}")
    if len(value) > max_items:
        raise FormatError(f"{where} has more than {max_items} items")
    return tuple(each(item, f"{where}[{i}]") for i, item in enumerate(value))


def strings(value: Any, where: str) -> tuple[str, ...]:
    return items(value, where, string)


def size(value: Any, where: str) -> int:
    """A byte count in a file: a whole number from 0 to MAX_SIZE_BYTES."""
    return integer(value, where, 0, MAX_SIZE_BYTES)
