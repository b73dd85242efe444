"""The start-up ladder: check a thresholds file's boundaries on the live group before serving.

When a Dispatch opens (the communicator or the vLLM plugin), each boundary of
the tables that apply (this world size, the file's dtypes; eager, and graph
on CUDA where both sides can be captured) is timed at a few sizes around it:
the backend the file gives each side, in interleaved rounds (the order
reversed every other round), each sample the slowest rank's. At each size
the file's choice keeps it unless the other side is clearly faster by the
decision rule calibrate uses (arxtune.runtime.faster). Every result is
checked exactly; a backend that gives a wrong result, raises or times out is
out (Outcome.failed): the router serves nothing of that (op, dtype) with it,
in any mode, for the life of the process. The whole ladder stays within a
budget (ARXTUNE_BOOT_BUDGET_S; without a file, opening its candidates
included, and a candidate that would import a framework the process has not
is left out): the ranks agree on the time spent before every size, so they
stop together.

Rank 0 decides and every rank applies its verdict. ARXTUNE_BOOT: `check`
(the default) says per boundary whether it held and warns once for each it
contradicts; `adjust` moves those boundaries (and, with no file, builds
tables from a coarse grid); `off` skips all of it. Rank 0 writes what was
measured as a small run in the results format (ARXTUNE_BOOT_OUT, else
~/.cache/arxtune/boot/), for `arxtune show`, `plot` and `calibrate`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from arxtune.runtime import env, runs
from arxtune.runtime.backends.base import Backend
from arxtune.runtime.faster import DEFAULT_MARGIN, PointTimes, clearly_faster
from arxtune.runtime.fingerprint import host_facts, nccl_version
from arxtune.runtime.group import GroupContext, all_max, gather_objects
from arxtune.runtime.ops import DTYPES, OP_SPECS, OPS, elements_per_rank, expected_output, make_input
from arxtune.runtime.rounds import Entry, Plan, Rounds
from arxtune.runtime.thresholds import Range, Table, Thresholds, merge_adjacent, ranges_from_points
from arxtune.runtime.timing import has_timer, make_timer
from arxtune.runtime.units import format_bytes

log = logging.getLogger("arxtune")

#: What the ladder does with a file (ARXTUNE_BOOT): its policy. A table's "mode" (eager, graph) is the runtime's word.
POLICIES = ("off", "check", "adjust")
#: The view (how a point is timed; the results' view column) that times a table of each mode.
VIEW_OF_MODE = {"eager": "eager", "graph": "graph"}
KiB, MiB = 1024, 1024 * 1024
#: Sizes probed around a boundary at b bytes: b/2 (the lower side), b and 2b (the upper side; lo is inclusive).
PROBE_FACTORS = (0.5, 1, 2)
#: The grid a deployment without a thresholds file is measured on under `adjust`.
COARSE_GRID = (4 * KiB, 64 * KiB, 1 * MiB)
#: Larger sizes are not probed: their buffers cost more memory and time than start-up should.
MAX_PROBE_BYTES = 64 * MiB
#: Rounds per size (fewer when the budget is short, never under 2: the rule pairs rounds), samples per round at most.
ROUNDS, MIN_ROUNDS, MAX_SAMPLES_PER_ROUND = 4, 2, 4
#: The part of the budget spent measuring: the rest covers the last size's overrun, agreeing on the verdict and the run.
MEASURE_SHARE = 0.85
#: Rounds a size may add where the incumbent and a challenger are close (faster.undecided), within its share:
#: the first rounds take half of it, so a clear size leaves the rest to the sizes after it.
MAX_EXTRA_ROUNDS = 8
#: A sample holds as many calls as fit this long (1 to MAX_CALLS_PER_SAMPLE), from the checked call's time.
SAMPLE_US, MAX_CALLS_PER_SAMPLE = 2000.0, 20


def candidates(device: torch.device) -> tuple[str, ...]:
    """What a communicator without a file compares with its baseline under `adjust`: each backend's `start_up_candidate`."""
    from arxtune.runtime.backends import start_up_candidates

    return start_up_candidates(device.type)


def within_reach(names: tuple[str, ...], named: set[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the candidates the ladder opens, {left out: the framework it would import}): opening a candidate must not
    import a framework this process has not imported (vLLM in a plain Communicator process: seconds, outside any
    budget), unless `named` (the file, ARXTUNE_OVERRIDES) names it."""
    import importlib.util

    from arxtune.runtime.backends import framework as framework_of

    def costly(name: str) -> bool:  # installed, not yet imported (one that is not installed fails to open at once)
        framework = framework_of(name)
        if not framework or framework in sys.modules or name in named:
            return False
        spec = importlib.util.find_spec(framework)
        return spec is not None and spec.origin not in (None, "namespace")  # a folder of that name is not the framework

    left = {n: framework_of(n) for n in names if costly(n)}
    return tuple(n for n in names if n not in left), left


def policy() -> str:
    """ARXTUNE_BOOT's value; an unknown one is a warning and `check`."""
    value = env.BOOT.get().lower()
    if value not in POLICIES:
        log.warning("arxtune: %s=%r is not one of %s; using check", env.BOOT.name, value, ", ".join(POLICIES))
        return "check"
    return value


def budget_s() -> float:
    """ARXTUNE_BOOT_BUDGET_S in seconds; a bad value is a warning and the default."""
    text = env.BOOT_BUDGET_S.get()
    try:
        value = float(text)
        if math.isfinite(value) and value >= 0:
            return value
    except ValueError:
        pass
    log.warning("arxtune: %s=%r is not a number of seconds >= 0; using %s", env.BOOT_BUDGET_S.name, text, env.BOOT_BUDGET_S.default)
    return float(env.BOOT_BUDGET_S.default)


def out_dir() -> Path:
    return Path(env.BOOT_OUT.get() or Path.home() / ".cache" / "arxtune" / "boot")


# -- the pure parts: what to probe, who wins, where a boundary goes


@dataclass(frozen=True)
class Boundary:
    """Where one table hands over from `below` to `above` (at `at` bytes, which `above` takes)."""

    mode: str
    op: str
    dtype: str
    at: int
    below: str
    above: str
    lo: int  # where `below`'s range starts
    hi: int | None  # where `above`'s range ends

    def describe(self) -> str:
        return f"{self.mode} {self.op}/{self.dtype} {self.below}|{self.above} at {format_bytes(self.at)}"

    def choice(self, nbytes: int) -> str:
        """The file's backend at `nbytes` (a probe lies within [lo, hi))."""
        return self.below if nbytes < self.at else self.above


def boundaries(tables: list[Table]) -> list[Boundary]:
    """Every hand-over between two different backends in `tables`, in table order."""
    return [
        Boundary(t.mode, t.op, t.dtype, b.lo, a.backend, b.backend, a.lo, b.hi)
        for t in tables
        for a, b in zip(t.ranges, t.ranges[1:])
        if a.backend != b.backend
    ]


def probe_sizes(boundary: Boundary, op: str, world: int, itemsize: int) -> list[int]:
    """Bytes actually moved at b/2, b, 2b (whole elements per rank), inside the two ranges and MAX_PROBE_BYTES."""
    sizes = set()
    for factor in PROBE_FACTORS:
        n = elements_per_rank(op, int(boundary.at * factor), world, itemsize)
        nbytes = OP_SPECS[op].nbytes(n, world, itemsize)
        if boundary.lo <= nbytes and (boundary.hi is None or nbytes < boundary.hi) and nbytes <= MAX_PROBE_BYTES:
            sizes.add(nbytes)
    return sorted(sizes)


@dataclass
class Measured:
    """One backend at one size: 'ok' with samples in rounds, or why it lost ('wrong', 'error')."""

    backend: str
    status: str
    rounds: list[list[float]] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.rounds)

    @property
    def times(self) -> PointTimes:
        return PointTimes.from_rounds(self.rounds)


def winner(incumbent: str, challengers: list[str], measured: dict[str, Measured], margin: float) -> str:
    """Who serves this size: the incumbent, unless a challenger is clearly faster (the fastest such), or it failed.

    A backend that failed loses; when the incumbent failed, the fastest correct challenger serves.
    """
    good = [c for c in challengers if c in measured and measured[c].ok]
    if incumbent not in measured or not measured[incumbent].ok:
        return min(good, key=lambda c: measured[c].times.median_us) if good else incumbent
    base = measured[incumbent].times
    better = [c for c in good if clearly_faster(measured[c].times, base, margin)]
    return min(better, key=lambda c: measured[c].times.median_us) if better else incumbent


def placed(sizes: list[int], winners: list[str], below: str, above: str) -> int | None:
    """Where the boundary goes by the winners at ascending `sizes`: between the last `below` win and the
    first `above` win (geometric midpoint, as calibrate places it); None when they interleave (no clear place)."""
    flips = [i for i in range(1, len(winners)) if winners[i] != winners[i - 1]]
    if len(flips) > 1 or (flips and winners[0] != below):
        return None
    if not flips:
        edge = sizes[-1] * 2 if winners[0] == below else sizes[0] / 2  # one step past the probes
        pair = (sizes[-1], edge) if winners[0] == below else (edge, sizes[0])
    else:
        pair = (sizes[flips[0] - 1], sizes[flips[0]])
    return int(math.ceil(math.sqrt(pair[0] * pair[1])))


def move_boundary(ranges: tuple[Range, ...], at: int, new: int) -> tuple[Range, ...]:
    """`ranges` with the hand-over at `at` moved to `new` (kept within its two ranges; one that empties goes)."""
    i = next((k for k, r in enumerate(ranges) if r.lo == at and k > 0), None)
    if i is None:
        return ranges
    a, b = ranges[i - 1], ranges[i]
    new = max(new, a.lo) if b.hi is None else min(max(new, a.lo), b.hi)
    out = list(ranges[: i - 1]) + [Range(a.lo, new, a.backend, "measured"), Range(new, b.hi, b.backend, "measured")] + list(ranges[i + 1 :])
    return merge_adjacent([r for r in out if r.hi is None or r.hi > r.lo])


@dataclass(frozen=True)
class Judged:
    """One boundary's verdict: 'held', 'moved' (to `new`), 'unclear' (winners interleave), 'out' (a side failed:
    a wrong result, an exception or a timeout) or 'not judged' (why)."""

    boundary: Boundary
    verdict: str
    new: int | None = None
    why: str = ""
    evidence: str = ""  # the sizes and medians behind a contradiction

    def describe(self, adjust: bool = True) -> str:
        b = self.boundary
        where = f"{b.op}/{b.dtype}{'' if b.mode == 'eager' else '@' + b.mode} {b.below}|{b.above}"
        if self.verdict == "moved":
            return (
                f"{where} {format_bytes(b.at)} -> {format_bytes(self.new)}"
                if adjust
                else f"{where} {format_bytes(b.at)} contradicted (ladder: {format_bytes(self.new)})"
            )
        return f"{where} {format_bytes(b.at)} {self.verdict}" + (f" ({self.why})" if self.why else "")


def judge(boundary: Boundary, sizes: list[int], points: dict[int, dict[str, Measured]], margin: float) -> Judged:
    """The verdict on one boundary from its measured sizes (those left out by the budget are missing from `points`)."""
    measured = [s for s in sizes if s in points]
    if not measured:
        return Judged(boundary, "not judged", why="budget spent" if sizes else "no size to probe")
    failed = [name for name in (boundary.below, boundary.above) if any(points[s][name].status != "ok" for s in measured)]
    if failed:  # not a slower side but a wrong one: the router takes it out (Outcome.failed), the boundary is moot
        return Judged(boundary, "out", why=f"{' and '.join(failed)} failed")
    wins = [winner(boundary.choice(s), [boundary.below, boundary.above], points[s], margin) for s in measured]
    if all(w == boundary.choice(s) for w, s in zip(wins, measured)):
        return Judged(boundary, "held")
    evidence = "; ".join(
        f"{format_bytes(s)}: " + ", ".join(f"{name} {_show(points[s].get(name))}" for name in (boundary.below, boundary.above))
        for s in measured
    )
    new = placed(measured, wins, boundary.below, boundary.above)
    if new is None:
        return Judged(boundary, "unclear", why="the winners interleave", evidence=evidence)
    return Judged(boundary, "moved", new, evidence=evidence)


def _show(m: Measured | None) -> str:
    if m is None:
        return "not measured"
    return f"{m.times.median_us:.1f} us" if m.ok else f"{m.status} ({m.error})"


def adjusted(thresholds: Thresholds, verdicts: list[Judged], world: int) -> Thresholds:
    """The file with every moved boundary of `world`'s tables at its new place (new Range tuples; the router does the rest)."""
    tables = []
    for t in thresholds.tables:
        ranges = t.ranges
        for j in verdicts:
            b = j.boundary
            if j.verdict == "moved" and t.world_size == world and (b.mode, b.op, b.dtype) == (t.mode, t.op, t.dtype):
                ranges = move_boundary(ranges, b.at, j.new)
        tables.append(dataclasses.replace(t, ranges=ranges))
    return dataclasses.replace(thresholds, tables=tuple(tables))


def coarse_tables(world: int, choices: dict[tuple[str, str], list[tuple[int, str]]], run_id: str) -> tuple[Table, ...]:
    """Tables from the coarse ladder's (size, winner) per (op, dtype), boundaries placed as calibrate places them."""
    return tuple(
        Table(op, dtype, world, ranges_from_points([(float(s), w, "measured") for s, w in points]), "eager", run_id, "eager")
        for (op, dtype), points in sorted(choices.items())
        if points
    )


# -- measuring on the group


class Prober:
    """Times backends at one (op, dtype, view, size) on the group, within the budget; every rank calls it alike."""

    def __init__(
        self, ctx: GroupContext, backends: dict[str, Backend], budget: float, margin: float = DEFAULT_MARGIN, start: float | None = None
    ):
        self.ctx = ctx
        self.backends = backends
        self.budget = budget
        self.margin = margin  # what `undecided` judges closeness by
        self.start = time.monotonic() if start is None else start  # earlier where opening the candidates counts
        self.points: dict[tuple, Measured] = {}  # (backend, op, dtype, view, nbytes) -> what was measured, in order

    def spent(self) -> float:
        """Seconds since the ladder began, the slowest rank's (so every rank decides alike)."""
        return all_max(time.monotonic() - self.start, self.ctx.cpu_group)

    def measure(
        self, names: list[str], op: str, dtype: str, view: str, nbytes: int, share_s: float, incumbent: str | None = None
    ) -> dict[str, Measured] | None:
        """Each named backend at this size, or None when the budget is spent (then on every rank).
        Where `incumbent` and a challenger are close after the rounds, more rounds follow (within bounds)."""
        key = lambda name: (name, op, dtype, view, nbytes)  # noqa: E731
        todo = [n for n in names if key(n) not in self.points]
        if todo:
            spent = self.spent()
            if spent >= self.budget:
                return None
            self._measure(todo, op, dtype, view, nbytes, min(share_s, self.budget - spent), incumbent)
        if not all(key(n) in self.points for n in names):
            return None
        return {n: self.points[key(n)] for n in names}

    def _measure(self, names: list[str], op: str, dtype: str, view: str, nbytes: int, share_s: float, incumbent: str | None = None) -> None:
        ctx, torch_dtype = self.ctx, DTYPES[dtype]
        n = elements_per_rank(op, nbytes, ctx.world_size, torch_dtype.itemsize)
        inp = make_input(op, n, ctx.rank, ctx.world_size, torch_dtype, ctx.device)
        want = expected_output(op, n, ctx.rank, ctx.world_size, torch_dtype)

        def timer(first_s: float):
            """As many calls a sample as fit SAMPLE_US by the checked call's time (1 to MAX_CALLS_PER_SAMPLE)."""
            calls = max(1, min(MAX_CALLS_PER_SAMPLE, int(SAMPLE_US * 1e-6 / max(first_s, 1e-6))))
            return make_timer(ctx.device, view, nbytes, calls=calls)

        entries = []
        for name in names:
            backend = self.backends[name]
            out = torch.empty(OP_SPECS[op].shapes(n, ctx.world_size)[1], dtype=torch_dtype, device=ctx.device)
            bind = getattr(backend, "bind", None)
            call = bind(op, inp, out) if bind else (lambda b=backend, o=out: getattr(b, op)(inp, o))
            entries.append(Entry(name, call, [out], want, timer, getattr(backend, "check", None), (inp,)))
        budget = _SizeBudget(self, share_s)
        for name, got in Rounds(ctx, self.margin).measure(entries, budget, incumbent).items():
            if got.status == "ok" and not got.rounds:  # one correct backend needs no rounds: its estimate is its one sample
                got.rounds = [[got.estimate_us]]
            if got.status:  # '': two left and no time for two rounds: not measured, so not judged
                self.points[(name, op, dtype, view, nbytes)] = Measured(name, got.status, got.rounds, got.error)

    def failed(self) -> dict[tuple[str, str, str], str]:
        """(backend, op, dtype) -> its first failure, with the size and view: what the router takes out for good."""
        found: dict[tuple[str, str, str], str] = {}
        for (name, op, dtype, view, nbytes), got in self.points.items():
            if got.status != "ok":
                found.setdefault((name, op, dtype), f"start-up ladder, {view} at {format_bytes(nbytes)}: {got.error}")
        return found


class _SizeBudget:
    """The ladder's budget at one size: ROUNDS rounds (fewer when `share_s` is short, never under MIN_ROUNDS) of
    at most MAX_SAMPLES_PER_ROUND samples, ending early once the whole budget is spent; extra rounds while the
    incumbent and a challenger are close, within the size's share, the budget and MAX_EXTRA_ROUNDS."""

    warmup_calls = 0  # the checked call and the estimate sample warm it up
    estimate_samples = 1  # a slow backend's samples cost start-up time: one estimates it

    def __init__(self, prober: Prober, share_s: float):
        self.prober, self.share_s, self.size_start = prober, share_s, 0.0

    def plan(self, per_sample_s: dict[str, float]) -> Plan | None:
        if len(per_sample_s) < 2:
            return Plan(0, {})  # one correct backend is not compared: no rounds
        sample_s = sum(per_sample_s.values()) or 1e-6
        rounds = min(ROUNDS, int(self.share_s / sample_s))
        if rounds < MIN_ROUNDS:
            return None
        per_round = max(1, min(MAX_SAMPLES_PER_ROUND, int(self.share_s / (2 * rounds * sample_s))))
        self.size_start = self.prober.spent()
        return Plan(rounds, {name: per_round for name in per_sample_s})

    def another(self, done: int, plan: Plan, close) -> bool:
        if done < plan.rounds:  # the budget spent: the rounds so far decide (every rank stops after the same round)
            return done < MIN_ROUNDS or self.prober.spent() < self.prober.budget
        if done >= plan.rounds + MAX_EXTRA_ROUNDS or not close():
            return False
        spent = self.prober.spent()
        return spent < self.prober.budget and spent - self.size_start < self.share_s


# -- the ladder as a whole


@dataclass
class Outcome:
    """What the ladder decided (the same on every rank): the thresholds to use, the start-up line's part, warnings."""

    thresholds: Thresholds | None
    line: str
    warnings: list[str] = field(default_factory=list)
    run_path: str = ""
    #: (backend, op, dtype) -> its first failure (a wrong result, an exception, a timeout): out for good.
    failed: dict[tuple[str, str, str], str] = field(default_factory=dict)


def modes_for(device: torch.device) -> tuple[str, ...]:
    """The table modes the ladder checks on this device: those timed by a view of the same name (timing.TIMERS)."""
    return tuple(m for m in VIEW_OF_MODE if has_timer(device, VIEW_OF_MODE[m]))


def run(
    ctx: GroupContext,
    thresholds: Thresholds | None,
    backends: dict[str, Backend],
    status: dict[str, dict],
    policy: str,
    candidates: tuple[str, ...],
    baseline: str,
    dtypes: tuple[str, ...] = (),
    since: float | None = None,
) -> Outcome:
    """The whole ladder on an opened group (a collective on ctx.cpu_group); rank 0's verdict for every rank.

    `backends` are open on every rank (agreed); `candidates` are what a
    deployment without a file may choose from beside `baseline`; `since`: the
    monotonic time the budget started (before opening what only the ladder needs).
    """
    budget, started = budget_s(), runs.now()
    prober = Prober(ctx, backends, budget * MEASURE_SHARE, thresholds.margin if thresholds else DEFAULT_MARGIN, since)
    if thresholds is None:
        outcome = _build(ctx, prober, policy, candidates, baseline, dtypes)
    else:
        outcome = _check(ctx, prober, thresholds, policy, backends, status)
    outcome.failed = prober.failed()
    outcome.line += f" in {prober.spent():.2f} s of {budget:g}"
    answers = gather_objects((outcome if ctx.rank == 0 else None, host_facts(ctx.device)), ctx.cpu_group)
    outcome = answers[0][0]  # rank 0's verdict, on every rank
    if ctx.rank == 0:
        for warning in outcome.warnings:
            log.warning("arxtune: %s", warning)
        outcome.run_path = write_run(
            ctx, prober, thresholds.baseline if thresholds else baseline, started, status, policy, [facts for _, facts in answers]
        )
    return outcome


def _check(ctx: GroupContext, prober: Prober, thresholds: Thresholds, policy: str, backends: dict, status: dict) -> Outcome:
    margin = thresholds.margin
    tables = [t for t in thresholds.tables if t.world_size == ctx.world_size and t.mode in modes_for(ctx.device)]
    plan, verdicts = [], []
    for b in boundaries(tables):
        if b.below not in backends or b.above not in backends:
            missing = [n for n in (b.below, b.above) if n not in backends]
            verdicts.append(Judged(b, "not judged", why=f"{', '.join(missing)} not open: {_reason(status, missing)}"))
        elif b.mode == "graph" and not all(getattr(backends[n], "capturable", False) for n in (b.below, b.above)):
            verdicts.append(Judged(b, "not judged", why="a side cannot be captured"))
        else:
            plan.append((b, probe_sizes(b, b.op, ctx.world_size, DTYPES[b.dtype].itemsize)))
    left = sum(len(sizes) for _, sizes in plan)
    for b, sizes in plan:
        points = {}
        for size in sizes:
            share = max(0.0, prober.budget - prober.spent()) / max(left, 1)
            left -= 1
            got = prober.measure([b.below, b.above], b.op, b.dtype, VIEW_OF_MODE[b.mode], size, share, b.choice(size))
            if got is not None:
                points[size] = got
        verdicts.append(judge(b, sizes, points, margin))
    return _verdict_outcome(thresholds, verdicts, policy, ctx.world_size)


def _reason(status: dict, names: list[str]) -> str:
    return "; ".join(status.get(n, {}).get("reason", "") or "not opened" for n in names)


def _verdict_outcome(thresholds: Thresholds, verdicts: list[Judged], policy: str, world: int) -> Outcome:
    counts = {v: sum(j.verdict == v for j in verdicts) for v in ("held", "moved", "unclear", "out", "not judged")}
    warnings = [
        f"start-up ladder contradicts {j.boundary.describe()}: the other side wins ({j.evidence})"
        + (
            "; moved to " + format_bytes(j.new)
            if policy == "adjust"
            else f"; the file is used as it is ({env.BOOT.name}=adjust would move it to {format_bytes(j.new)})"
        )
        for j in verdicts
        if j.verdict == "moved"
    ]
    if not verdicts:
        return Outcome(thresholds, f"ladder {policy}: no boundary to check")
    said = {
        "held": "held",
        "moved": "moved" if policy == "adjust" else "contradicted",
        "unclear": "unclear",
        "out": "out",
        "not judged": "not judged",
    }
    head = ", ".join(f"{n} {said[v]}" for v, n in counts.items() if n)
    detail = "; ".join(j.describe(policy == "adjust") for j in verdicts)
    moved = any(j.verdict == "moved" for j in verdicts)
    use = adjusted(thresholds, verdicts, world) if policy == "adjust" and moved else thresholds
    return Outcome(use, f"ladder {policy}: {len(verdicts)} boundaries, {head} ({detail})", warnings)


def _build(ctx: GroupContext, prober: Prober, policy: str, candidates: tuple[str, ...], baseline: str, dtypes: tuple[str, ...]) -> Outcome:
    """No file: under `adjust`, tables from the coarse grid between the baseline and each candidate."""
    if policy != "adjust":
        return Outcome(None, f"ladder {policy}: no thresholds file, nothing to check ({env.BOOT.name}=adjust builds tables)")
    challengers = [n for n in candidates if n != baseline and n in prober.backends]
    if baseline not in prober.backends or not challengers:
        return Outcome(None, f"ladder adjust: no thresholds file and no backend beside {baseline} to compare; {baseline} serves")
    dtypes = dtypes or (("bfloat16",) if ctx.device.type == "cuda" else ("float32",))
    plan = [(op, dtype, size) for dtype in dtypes for op in OPS for size in COARSE_GRID]
    choices: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for i, (op, dtype, size) in enumerate(plan):
        names = [baseline] + [n for n in challengers if op in getattr(prober.backends[n], "ops", OPS)]
        n = elements_per_rank(op, size, ctx.world_size, DTYPES[dtype].itemsize)
        nbytes = OP_SPECS[op].nbytes(n, ctx.world_size, DTYPES[dtype].itemsize)
        share = max(0.0, prober.budget - prober.spent()) / (len(plan) - i)
        got = prober.measure(names, op, dtype, "eager", nbytes, share, baseline)
        if got is not None:
            choices.setdefault((op, dtype), []).append((nbytes, winner(baseline, names[1:], got, DEFAULT_MARGIN)))
    if not choices:
        return Outcome(None, f"ladder adjust: no thresholds file and the budget ran out before a size was measured; {baseline} serves")
    run_id = "boot"
    tables = coarse_tables(ctx.world_size, choices, run_id)
    built = Thresholds(baseline, DEFAULT_MARGIN, {"source": "start-up ladder", "grid": list(COARSE_GRID)}, tables)
    taken = "; ".join(
        f"{t.op}/{t.dtype} "
        + ", ".join(f"[{format_bytes(r.lo)}, {'inf' if r.hi is None else format_bytes(r.hi)}) {r.backend}" for r in t.ranges)
        for t in tables
    )
    measured = sum(len(p) for p in choices.values())
    return Outcome(
        built, f"ladder adjust: no thresholds file; built {len(tables)} eager tables from {measured} of {len(plan)} sizes ({taken})"
    )


# -- evidence


def write_run(
    ctx: GroupContext, prober: Prober, baseline: str, started: str, status: dict, policy: str, hosts: list[dict] | None = None
) -> str:
    """What was measured, as a run in the results format (runtime.runs); a failure is a warning."""
    from arxtune import __version__

    records = sorted(prober.points.items())
    if not records:
        return ""
    run_id = f"boot-w{ctx.world_size}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}"
    used = {name for (name, *_), _ in records}
    meta = runs.RunMeta(
        run_id=run_id,
        world_size=ctx.world_size,
        device_type=ctx.device.type,
        config={"step_factor": 2.0},
        baseline=baseline,
        started=started,
        finished=runs.now(),
        arxtune_version=__version__,
        torch_version=torch.__version__,
        nccl_version=nccl_version(ctx.device),
        driver_version=hosts[0]["driver"] if hosts else None,
        rdma_devices=hosts[0]["rdma_devices"] if hosts else [],
        hostnames=[h["hostname"] for h in hosts or []],
        device_names=[h["device"] for h in hosts or []],
        command=f"start-up ladder ({env.BOOT.name}={policy})",
        backends={
            name: {
                k: v
                for k, v in status.get(name, {"available": True, "reason": ""}).items()
                if k in ("available", "reason", "capturable", "ops", "capacity", "options")
            }
            for name in sorted(used)
        },
    )
    points = [
        runs.PointRecord(
            name,
            op,
            dtype,
            view,
            nbytes,
            nbytes,
            ctx.world_size,
            got.status,
            tuple(s for r in got.rounds for s in r) if got.ok else (),
            " ".join(got.error.split()),
            tuple(len(r) for r in got.rounds) if got.ok else (),
        )
        for (name, op, dtype, view, nbytes), got in records
    ]
    try:
        return str(runs.write_run(out_dir(), meta, points))
    except Exception as exc:  # evidence is worth a warning, never a failed start-up
        log.warning("arxtune: start-up ladder: cannot write its run to %s (%s)", out_dir() / run_id, exc)
        return ""
