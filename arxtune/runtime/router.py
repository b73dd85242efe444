"""The runtime's one router: (op, dtype, bytes, capturing?) -> backend, for the communicator and the vLLM plugin.

Start-up (`open_router`) turns a thresholds file into per-mode tables for this
world size: the `graph` table while a CUDA graph is being captured, the
`eager` table otherwise (a mode the file lacks borrows the other's, and the
start-up line says so). Explicit overrides are laid over the calibrated
ranges. Backends are opened with the options the file recorded, and a range
resolves to None (the caller's own path) when its backend is native to the
caller, could not start, does not implement the op, or cannot be captured
in the graph table, or was caught giving a wrong result (the router's
`excluded`, for every mode and the life of the process). Per call: one dict
get, one bisect, the backend's `supports()` (its capacity) and a counter.

Overrides: ARXTUNE_OVERRIDES, the same on every rank, items separated by ','
or ';', each `OP[/DTYPE][@MODE]:LO-[HI]=BACKEND`, sizes in bytes or with a unit,
LO inclusive, HI exclusive (empty = no limit), BACKEND a name or a variant, e.g.
`all_reduce:0-64KiB=arx; all_reduce:64KiB-1MiB=nccl[proto=LL,channels=4]; all_gather/bfloat16@graph:1MiB-=nccl`.

Whether the file is in force at all (its fingerprint under ARXTUNE_FINGERPRINT,
the start-up ladder) is arxtune.runtime.dispatch's decision: the router routes
by the thresholds it is given.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from arxtune.runtime.backends import check_extra, names, split_name
from arxtune.runtime.backends.startup import open_backends
from arxtune.runtime.group import GroupContext
from arxtune.runtime.ops import DTYPES, OPS
from arxtune.runtime.units import format_bytes, parse_bytes
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime.thresholds import MODES, Range, Thresholds, merge_adjacent
from arxtune.runtime import env

ENV_OVERRIDES = env.OVERRIDES.name
_OVERRIDE = re.compile(
    r"(?P<op>\w+)(?:/(?P<dtype>\w+))?(?:@(?P<mode>\w+))?:(?P<lo>[^-=]*)-(?P<hi>[^=]*)="
    r"(?P<backend>[\w.-]+(?:\[[^\[\]]*\])?)"
)
#: Items are separated by ',' or ';' outside a variant's brackets (nccl[proto=LL,channels=4]).
_ITEM_SEPARATOR = re.compile(r"[,;](?![^\[]*\])")


@dataclass(frozen=True)
class Override:
    """Force `backend` for [lo, hi) bytes of `op` (every dtype / both modes when None)."""

    op: str
    lo: int
    hi: int | None
    backend: str
    dtype: str | None = None
    mode: str | None = None

    def describe(self) -> str:
        where = self.op + (f"/{self.dtype}" if self.dtype else "") + (f"@{self.mode}" if self.mode else "")
        return f"{where} [{format_bytes(self.lo)}, {'inf' if self.hi is None else format_bytes(self.hi)}) -> {self.backend}"


def parse_overrides(text: str) -> tuple[Override, ...]:
    """ARXTUNE_OVERRIDES' value -> overrides; anything unreadable is one ArxtuneError naming the item."""
    found = []
    for item in filter(None, (part.strip() for part in _ITEM_SEPARATOR.split(text or ""))):
        match = _OVERRIDE.fullmatch(item.replace(" ", ""))
        if not match:
            raise ArxtuneError(
                f"{ENV_OVERRIDES}: cannot read {item!r}; write OP[/DTYPE][@MODE]:LO-[HI]=BACKEND, e.g. all_reduce:0-64KiB=arx"
            )
        g = match.groupdict()
        try:
            lo, hi = parse_bytes(g["lo"] or 0), (parse_bytes(g["hi"]) if g["hi"] else None)
        except ArxtuneError as exc:
            raise ArxtuneError(f"{ENV_OVERRIDES}: {item!r}: {exc}") from None
        if g["op"] not in OPS or (g["dtype"] and g["dtype"] not in DTYPES) or (g["mode"] and g["mode"] not in MODES):
            raise ArxtuneError(
                f"{ENV_OVERRIDES}: {item!r} names an unknown op, dtype or mode (ops {', '.join(OPS)}; modes {', '.join(MODES)})"
            )
        if hi is not None and hi <= lo:
            raise ArxtuneError(f"{ENV_OVERRIDES}: {item!r} is an empty range")
        found.append(Override(g["op"], lo, hi, g["backend"], g["dtype"], g["mode"]))
    return tuple(found)


def overlay(ranges: tuple[Range, ...], lo: int, hi: int | None, backend: str) -> tuple[Range, ...]:
    """`ranges` with [lo, hi) given to `backend` (source 'override'); still covers 0..inf without gaps."""
    out: list[Range] = []
    for r in ranges:
        if r.lo < lo:
            out.append(Range(r.lo, lo if r.hi is None or r.hi > lo else r.hi, r.backend, r.source))
        if hi is not None and (r.hi is None or r.hi > hi):
            out.append(Range(max(r.lo, hi), r.hi, r.backend, r.source))
    out.append(Range(lo, hi, backend, "override"))
    out.sort(key=lambda r: r.lo)
    return merge_adjacent(out)


def check_names(thresholds: Thresholds, source: str = "thresholds") -> Thresholds:
    """The file, when every backend it names is one this process can open (built in or ARXTUNE_EXTRA_BACKENDS);
    else one FormatError naming the first field that is not. The file's parser checks only that names are names."""
    known = names()
    for where, name in thresholds.named_backends():
        if split_name(name)[0] not in known:
            raise FormatError(
                f"{source}: {where} {name!r} is unknown; known: {', '.join(known)}; regenerate it with "
                "`arxtune calibrate RUN [RUN ...]` or name the backend in {env.EXTRA_BACKENDS.name}"
            )
    return thresholds


def mode_tables(thresholds: Thresholds | None, world: int, overrides: tuple[Override, ...] = ()) -> tuple[dict, list[str]]:
    """{(mode, op, dtype name): ranges} for one world size, a missing mode borrowing the other's, overrides laid over.

    Also the notes on what was borrowed, for the start-up line.
    """
    own = {(t.mode, t.op, t.dtype): t.ranges for t in (thresholds.tables if thresholds else ()) if t.world_size == world}
    keys = {(op, dtype) for _, op, dtype in own}
    keys |= {(o.op, d) for o in overrides for d in ([o.dtype] if o.dtype else DTYPES)}
    baseline = thresholds.baseline if thresholds else ""
    tables, borrowed = {}, Counter()
    for op, dtype in keys:
        for mode in MODES:
            other = MODES[1 - MODES.index(mode)]
            ranges = own.get((mode, op, dtype))
            if ranges is None and (other, op, dtype) in own:
                ranges = own[(other, op, dtype)]
                borrowed[(mode, other)] += 1
            ranges = ranges or (Range(0, None, baseline),)
            for o in overrides:
                if o.op == op and o.dtype in (None, dtype) and o.mode in (None, mode):
                    ranges = overlay(ranges, o.lo, o.hi, o.backend)
            tables[(mode, op, dtype)] = ranges
    notes = [f"{mode} uses {other}'s table for {n} (op, dtype)" for (mode, other), n in sorted(borrowed.items())]
    return tables, notes


class Router:
    """Per call: the backend for (op, dtype, bytes) in the current mode, or None for the caller's own path.

    `calls` counts every call by (op, backend name), `fallback` naming the caller's path. `excluded` is the
    one record of what may not serve: (backend name, op, dtype name) -> why, for every mode and the life of
    the process (a backend caught giving a wrong result, raising or timing out); `rebuild(excluded)` gives
    the routes again when one is added while serving.
    """

    def __init__(
        self,
        routes: dict,
        fallback: str,
        capturing: Callable[[], bool] | None = None,
        rebuild: Callable[[dict], dict] | None = None,
        excluded: dict | None = None,
    ):
        self._routes = routes  # (mode, op, torch dtype) -> (range starts after the first, [(backend, name) or None])
        self.fallback = fallback
        self._capturing = capturing
        self._rebuild = rebuild
        self.excluded: dict[tuple[str, str, str], str] = dict(excluded or {})
        self.calls: Counter = Counter()

    def exclude(self, name: str, op: str, dtype: str, why: str) -> bool:
        """Take `name` out of (op, dtype) in every mode for good: its ranges go to the fallback. False if it already was."""
        if (name, op, dtype) in self.excluded:
            return False
        self.excluded[(name, op, dtype)] = why
        if self._rebuild is not None:
            self._routes = self._rebuild(self.excluded)
        return True

    def close(self) -> None:
        """Forget every backend: every later call is the fallback's."""
        self._routes, self._rebuild = {}, None

    @property
    def takes_anything(self) -> bool:
        """Whether any range goes to a backend other than the caller's own path."""
        return any(choice is not None for _, choices in self._routes.values() for choice in choices)

    def mode(self) -> str:
        return "graph" if self._capturing is not None and self._capturing() else "eager"

    def pick(self, op: str, dtype: torch.dtype, nbytes: int):
        """The backend object for this call, or None (the caller's own path); counted either way."""
        entry = self._routes.get((self.mode(), op, dtype))
        choice = None
        if entry is not None:
            starts, choices = entry
            choice = choices[bisect.bisect_right(starts, nbytes)]
            if choice is not None and not choice[0].supports(op, dtype, nbytes):
                choice = None
        if choice is None:
            self.calls[(op, self.fallback)] += 1
            return None
        self.calls[(op, choice[1])] += 1
        return choice[0]

    def count(self, op: str, name: str | None = None) -> None:
        """A call served elsewhere (e.g. a reduce-scatter along dim 1 only the caller's path can do)."""
        self.calls[(op, name or self.fallback)] += 1


def resolve(tables: dict, opened: dict, native: Callable[[str], bool], excluded: dict | None = None) -> dict:
    """Range names -> (backend, name), or None where the caller's own path serves the call (or the backend is
    excluded for that op and dtype: `excluded` holds (name, op, dtype) keys)."""
    excluded = excluded or {}

    def usable(name: str, op: str, dtype: str, mode: str):
        backend = opened.get(name)
        if native(name) or backend is None or op not in getattr(backend, "ops", OPS) or (name, op, dtype) in excluded:
            return None
        if mode == "graph" and not getattr(backend, "capturable", False):
            return None
        return (backend, name)

    return {
        (mode, op, DTYPES[dtype]): ([r.lo for r in ranges[1:]], [usable(r.backend, op, dtype, mode) for r in ranges])
        for (mode, op, dtype), ranges in tables.items()
    }


def _spans(ranges: tuple[Range, ...], choices: list) -> list[tuple[int, int | None, str]]:
    """(lo, hi, backend) of the ranges a backend takes, neighbours with the same backend joined."""
    spans: list[list] = []
    for r, choice in zip(ranges, choices):
        if choice is None:
            continue
        if spans and spans[-1][1] == r.lo and spans[-1][2] == choice[1]:
            spans[-1][1] = r.hi
        else:
            spans.append([r.lo, r.hi, choice[1]])
    return [tuple(span) for span in spans]


@dataclass
class Opened:
    """What start-up decided: the router, the backends it opened, its one line and the problems to warn about."""

    router: Router
    backends: dict
    line: str
    problems: list[str]

    def close(self) -> None:
        """Close every backend and let go of them (and so of their process groups); a second call does nothing."""
        for backend in self.backends.values():
            backend.close()
        self.backends = {}
        self.router.close()


def backend_context(ctx: GroupContext, thresholds: Thresholds | None) -> GroupContext:
    """ctx with the options the file recorded per backend: backends open here as they were measured."""
    setup = thresholds.backend_setup if thresholds else {}
    return dataclasses.replace(ctx, options={**ctx.options, **{name: s.options for name, s in setup.items()}})


def open_router(
    thresholds: Thresholds | None,
    ctx: GroupContext,
    fallback: str | tuple[str, ...],
    native: Callable[[str], bool],
    capturing: Callable[[], bool] | None = None,
    also_open: tuple[str, ...] = (),
    overrides: tuple[Override, ...] | None = None,
    ready: tuple[dict, dict] | None = None,
    excluded: dict | None = None,
    fingerprint: str = "fingerprint: no file",
) -> Opened:
    """Open what the file (and the overrides) name for this group and build the router.

    `fallback`: the name the caller's own path is counted under, or the baselines in `also_open`, preferred
    first: the first that opened serves the rest (the last when none did). `native(name)`: whether the caller serves that backend's ranges itself (its
    baseline); `also_open`: backends the caller needs opened besides (e.g. the
    communicator's baseline). `overrides` default to ARXTUNE_OVERRIDES', whose
    bad value raises ArxtuneError (the same on every rank). `ready`: (backends,
    status) already opened on every rank (the start-up ladder's), used instead
    of opening them again; those not wanted are closed. `excluded`: (name, op,
    dtype) -> why, the backends start-up caught giving a wrong result, raising
    or timing out: out of that (op, dtype) in every mode, one problem each.
    `fingerprint`: what the start-up line says of the file's fingerprint (dispatch's verdict).
    """
    if overrides is None:
        overrides = parse_overrides(env.OVERRIDES.get())
    check_extra()  # a malformed ARXTUNE_EXTRA_BACKENDS is refused here as in `arxtune sweep`, never ignored
    problems, parts = [], []
    tables, notes = mode_tables(thresholds, ctx.world_size, overrides)
    setup = thresholds.backend_setup if thresholds else {}
    named = {r.backend for ranges in tables.values() for r in ranges}
    wanted = sorted(n for n in named if not native(n) and n not in also_open) + list(also_open)
    have, have_status = ready or ({}, {})
    opened, opened_status = open_backends([n for n in wanted if n not in have_status], backend_context(ctx, thresholds))
    for name, backend in have.items():
        if name in wanted:
            opened[name] = backend
        else:
            backend.close()
    opened_status.update({name: state for name, state in have_status.items() if name in wanted})
    for name, state in opened_status.items():
        if not state["available"]:
            problems.append(f"{name} cannot start ({state['reason']})")
    counts = Counter(mode for mode, _, _ in tables)
    parts.append("tables " + ", ".join(f"{m} {counts.get(m, 0)}" for m in MODES) + (f" ({'; '.join(notes)})" if notes else ""))
    capacity = []
    for name, state in sorted(opened_status.items()):
        for op, limit in sorted(state.get("capacity", {}).items()):
            recorded = setup.get(name).capacity.get(op) if name in setup else None
            capacity.append(
                f"{name} {op}<={format_bytes(limit)}"
                + (f" (file measured {format_bytes(recorded)})" if recorded not in (None, limit) else "")
            )
    parts.append("capacity " + (", ".join(capacity) or "unlimited"))
    # what a backend decided at start that the reader must see (arxg: how its GPU reaches host memory)
    parts += [note() for _, b in sorted(opened.items()) if callable(note := getattr(b, "startup_note", None))]
    parts.append(fingerprint)
    parts.append("overrides " + ("; ".join(o.describe() for o in overrides) if overrides else f"none (${ENV_OVERRIDES})"))
    excluded = dict(excluded or {})
    problems += [
        f"{name} is out of {op}/{dtype} in every mode for the life of this process: {why}" for (name, op, dtype), why in excluded.items()
    ]
    routes = resolve(tables, opened, native, excluded)
    taken = [
        f"{mode} {op}/{dtype} [{format_bytes(lo)}, {'inf' if hi is None else format_bytes(hi)}) -> {name}"
        for (mode, op, dtype), ranges in sorted(tables.items())
        for lo, hi, name in _spans(ranges, routes[(mode, op, DTYPES[dtype])][1])
    ]
    parts.append("takes " + ("; ".join(taken) if taken else "nothing"))
    if excluded:
        parts.append(f"out {len(excluded)} (" + "; ".join(f"{name} {op}/{dtype}" for name, op, dtype in excluded) + ")")
    if isinstance(fallback, tuple):
        fallback = next((name for name in fallback if name in opened), fallback[-1])
    router = Router(routes, fallback, capturing, lambda now: resolve(tables, opened, native, now), excluded)
    return Opened(router, opened, ", ".join(parts), problems)
