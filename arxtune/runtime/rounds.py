"""The measuring engine: the sweep and the start-up ladder time backends with it, each within its own budget.

At one point (op, dtype, view, size), backend by backend: the first call is
checked exactly (and timed: the ladder sizes its samples by it); warm-up calls
follow, then a few barrier-aligned samples estimate each backend's time per
sample, the slowest rank's. The client's budget turns those estimates into
rounds; within a round the backends take turns, in reversed order every other
round, so slow drift (other load, clocks) falls on all of them alike; each
sample releases all ranks together by a barrier and keeps the slowest rank's
time. Where the reference backend and a challenger are still close
(decision.undecided), the budget may grant more rounds. After the rounds the
timed calls' outputs are checked again (`after_check`, the one place a further
check hooks in).

Any failure on any rank (an exception, a wrong result, a backend's own `check`)
is agreed: every rank gets the same Result, 'error' outranking 'wrong', with
each failing rank's message. A failure the client calls fatal (a peer that
does not answer) is raised instead, on the rank that saw it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from arxtune.runtime.faster import DEFAULT_MARGIN, PointTimes, undecided
from arxtune.runtime.group import gather_objects, max_per_iteration
from arxtune.runtime.ops import mismatch
from arxtune.runtime.timing import Timer

#: Barrier-aligned samples that estimate a backend's time per sample, after its warm-up (a budget may take fewer).
ESTIMATE_SAMPLES = 3


@dataclass
class Entry:
    """One backend at the point: its call, the buffers it writes and what they must hold."""

    name: str
    call: Callable[[], None]
    outs: list[torch.Tensor]  # every buffer the calls write (all are checked after timing; the first after the first call)
    expected: torch.Tensor
    #: The first call's seconds (slowest rank) -> this backend's timer.
    timer: Callable[[float], Timer]
    #: The backend's check for failures its calls could not raise (inside a graph replay), if it has one.
    check: Callable[[], None] | None = None
    #: Buffers held alive for the calls (a bound call may keep only their addresses).
    keep: tuple = ()


@dataclass
class Result:
    """One backend at one point: 'ok' with samples in rounds, 'wrong' or 'error' (why), or '' (the budget gave
    it no rounds: not measured). `estimate_us` is the slowest rank's per-call time from the estimate samples."""

    name: str
    status: str
    rounds: list[list[float]] = field(default_factory=list)
    error: str = ""
    estimate_us: float = 0.0

    @property
    def times(self) -> PointTimes:
        return PointTimes.from_rounds(self.rounds)


@dataclass(frozen=True)
class Plan:
    """The rounds a budget grants: how many at first, and each backend's samples per round."""

    rounds: int
    per_round: dict[str, int]


class Budget(Protocol):
    """What a client decides: warm-up, how estimates become rounds, and whether another round runs. Every rank
    must answer alike (from agreed values, or a collective every rank calls)."""

    @property
    def warmup_calls(self) -> int:
        """Untimed calls before the estimate."""

    @property
    def estimate_samples(self) -> int:
        """Samples the estimate takes the median of."""

    def plan(self, per_sample_s: dict[str, float]) -> Plan | None:
        """Rounds for the backends still live ({name: wall seconds per sample}); None: not measured at all."""

    def another(self, done: int, plan: Plan, close: Callable[[], bool]) -> bool:
        """Whether round `done` (0-based) runs; `close()`: the reference and a challenger are still close."""


def _never(exc: BaseException) -> bool:
    return False


class Rounds:
    """The engine on one group; every rank calls `measure` alike and gets the same results."""

    def __init__(self, ctx, margin: float = DEFAULT_MARGIN, fatal: Callable[[BaseException], bool] = _never):
        self.ctx = ctx
        self.margin = margin  # what `undecided` judges closeness by
        self.fatal = fatal  # failures raised, not recorded

    def sync(self) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def _agree(self, status: str, message: str, value=None) -> tuple[str, str, list]:
        """(status, every failing rank's message, every rank's `value`): the same on every rank."""
        answers = gather_objects((status, message, value), self.ctx.cpu_group)
        failed = [(s, f"rank {r}: {m}") for r, (s, m, _) in enumerate(answers) if s != "ok"]
        values = [v for _, _, v in answers]
        if not failed:
            return "ok", "", values
        return ("error" if any(s == "error" for s, _ in failed) else "wrong"), "; ".join(m for _, m in failed), values

    def _failure(self, exc: Exception, when: str = "") -> tuple[str, str]:
        if self.fatal(exc):
            raise exc
        return "error", f"{type(exc).__name__}{when}: {exc}"

    def first_call(self, entry: Entry) -> tuple[Result | None, float]:
        """The exact first call: (a failure Result or None, its slowest rank's seconds)."""
        status, message, took = "ok", "", 0.0
        try:
            begin = time.perf_counter()
            entry.call()
            self.sync()
            took = time.perf_counter() - begin
            if entry.check is not None:
                entry.check()
            wrong = mismatch(entry.outs[0], entry.expected)  # the first call wrote the first buffer
            if wrong:
                status, message = "wrong", f"wrong result: {wrong}"
        except Exception as exc:  # a backend's failure becomes data, not a crash
            status, message = self._failure(exc)
        status, message, took_all = self._agree(status, message, took)
        return (Result(entry.name, status, error=message) if status != "ok" else None), max(took_all)

    def warm_up(
        self, entry: Entry, first_s: float, calls: int, estimates: int = ESTIMATE_SAMPLES
    ) -> tuple[Result | None, Timer | None, float, float]:
        """Warm-up calls, the timer's own preparation and the estimate samples: (a failure Result or None, the
        timer, wall seconds per sample with its barrier, microseconds per call), both the slowest rank's."""
        status, message, estimate, timer = "ok", "", (0.0, 0.0), None
        try:
            timer = entry.timer(first_s)
            for _ in range(calls):
                entry.call()
            self.sync()
            timer.prepare(entry.call)
            walls, per_call = [], []
            for _ in range(estimates):
                start = time.perf_counter()
                dist.barrier(group=self.ctx.cpu_group)
                per_call.append(timer.time_once(entry.call))
                walls.append(time.perf_counter() - start)
            self.sync()
            if entry.check is not None:
                entry.check()
            estimate = (statistics.median(walls), statistics.median(per_call))
        except Exception as exc:
            status, message = self._failure(exc)
        status, message, agreed = self._agree(status, message, estimate)
        if status != "ok":
            return Result(entry.name, status, error=message), None, 0.0, 0.0
        return None, timer, max(w for w, _ in agreed), max(c for _, c in agreed)

    def one_round(self, entry: Entry, timer: Timer, samples: int) -> tuple[list[float], str, str]:
        """One backend's samples in one round, the slowest rank's each: (samples, status, error). A failure on any
        rank reaches every rank as an infinite sample, and then its message is agreed."""
        local, status, message = [], "ok", ""
        try:
            for _ in range(samples):
                dist.barrier(group=self.ctx.cpu_group)
                local.append(timer.time_once(entry.call))
            self.sync()
            if entry.check is not None:
                entry.check()
        except Exception as exc:
            status, message = self._failure(exc, " while timed")
            local = []
        local += [math.inf] * (samples - len(local))
        slowest = max_per_iteration(local, self.ctx.cpu_group)
        if all(math.isfinite(s) for s in slowest):
            return slowest, "ok", ""
        status, message, _ = self._agree(status, message)
        return [], status, message or "failed while timed on another rank"

    def after_check(self, entry: Entry) -> tuple[str, str]:
        """The check after timing, on this rank: what the timed calls wrote, every rotated buffer."""
        self.sync()
        wrong = next(filter(None, (mismatch(out, entry.expected) for out in entry.outs)), None)
        return ("wrong", f"after timing: wrong result: {wrong}") if wrong else ("ok", "")

    def _close(self, reference: str | None, samples: dict[str, list[list[float]]]) -> bool:
        """Whether the reference and a challenger are still close (another round could change the rule's answer)."""
        times = {name: PointTimes.from_rounds(rounds) for name, rounds in samples.items() if rounds}
        if reference not in times:
            return False
        return any(undecided(t, times[reference], self.margin) for name, t in times.items() if name != reference)

    def measure(self, entries: list[Entry], budget: Budget, reference: str | None = None) -> dict[str, Result]:
        """Every entry at this point, within `budget`; `reference`: whose closeness to a challenger asks for rounds."""
        results: dict[str, Result] = {}
        live: list[tuple[Entry, Timer]] = []
        estimates: dict[str, tuple[float, float]] = {}
        for entry in entries:
            failed, first_s = self.first_call(entry)
            if failed is None:
                failed, timer, wall_s, per_call_us = self.warm_up(entry, first_s, budget.warmup_calls, budget.estimate_samples)
            if failed is not None:
                results[entry.name] = failed
                continue
            live.append((entry, timer))
            estimates[entry.name] = (wall_s, per_call_us)
        plan = budget.plan({name: wall for name, (wall, _) in estimates.items()}) if live else None
        if plan is None:
            results.update({e.name: Result(e.name, "") for e, _ in live})
            return results
        samples: dict[str, list[list[float]]] = {e.name: [] for e, _ in live}
        if plan.rounds:
            for entry, _ in live:
                for out in entry.outs:
                    out.zero_()  # the timed calls must write the result again: checked after the rounds
            self.sync()
        done = 0
        while budget.another(done, plan, lambda: self._close(reference, {n: samples[n] for n in samples if n not in results})):
            for entry, timer in live if done % 2 == 0 else live[::-1]:
                if entry.name in results:
                    continue
                got, status, message = self.one_round(entry, timer, plan.per_round[entry.name])
                if status != "ok":
                    results[entry.name] = Result(entry.name, status, error=message)
                else:
                    samples[entry.name].append(got)
            done += 1
        checked = [e for e, _ in live if e.name not in results]
        for entry in checked:
            status, message = self.after_check(entry)
            status, message, _ = self._agree(status, message)
            results[entry.name] = Result(
                entry.name, status, samples[entry.name] if status == "ok" else [], message, estimates[entry.name][1]
            )
        return {e.name: results[e.name] for e in entries}
