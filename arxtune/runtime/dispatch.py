"""The one dispatch path: load the thresholds file, agree on it across the group, open the router, make the call.

The bundled communicator and the vLLM plugin both delegate here; they differ
only in what serves the calls no range takes (the communicator opens a
baseline backend, the plugin hands them back to vLLM) and so in which backend
names count as their own. A file that cannot be used is a reason, never an
exception: the caller warns once and serves everything itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from arxtune.runtime import env, ladder
from arxtune.runtime.backends import framework
from arxtune.runtime.backends.base import Backend
from arxtune.runtime.backends.startup import default_baseline, open_backends
from arxtune.runtime.group import GroupContext, agreed_reason, all_max, gather_objects
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.ops import OP_SPECS, differs, dtype_name
from arxtune.runtime.fingerprint import host_facts, running_fingerprint
from arxtune.runtime.router import Router, backend_context, check_names, open_router, parse_overrides
from arxtune.runtime.thresholds import Thresholds, load
from arxtune.runtime.units import format_bytes

log = logging.getLogger("arxtune")


def default_thresholds_path() -> Path:
    """Where deployments look when no path is given: $ARXTUNE_THRESHOLDS, else ~/.config/arxtune/thresholds.json."""
    return Path(env.THRESHOLDS.get() or Path.home() / ".config" / "arxtune" / "thresholds.json")


def read_thresholds(
    world_size: int, source: str | Path | Thresholds | None = None, model_dtype: torch.dtype | None = None
) -> tuple[Thresholds | None, Path | None, str]:
    """(thresholds, path, why not) for a group of `world_size`, without raising.

    A missing, malformed or unknown-version file, one with no table for this
    world size, or one that does not cover the model's dtype (when given) is a
    reason. The thresholds come back even then when the file itself was
    readable (a caller may still want its baseline). `source` defaults to
    default_thresholds_path().
    """
    if isinstance(source, Thresholds):
        thresholds, path, where = source, None, "the Thresholds given"
    else:
        path = Path(source) if source else default_thresholds_path()
        if not source and not path.is_file():
            return (
                None,
                path,
                (f"no thresholds file at {path} (set {env.THRESHOLDS.name}, or write one with `arxtune calibrate RUN --install`)"),
            )
        try:
            thresholds = check_names(load(path), str(path))
        except ArxtuneError as exc:
            return None, path, str(exc)
        where = str(path)
    if world_size not in thresholds.world_sizes:
        return thresholds, path, f"{where} holds tables for world sizes {sorted(thresholds.world_sizes)}, not {world_size}"
    if model_dtype is not None:
        covered = sorted({t.dtype for t in thresholds.tables if t.world_size == world_size})
        try:
            wanted = dtype_name(model_dtype)
        except KeyError:
            wanted = str(model_dtype)
        if wanted not in covered:
            return thresholds, path, f"{where} covers {', '.join(covered)}, not the model's {wanted}"
    return thresholds, path, ""


def thresholds_digest(thresholds: Thresholds | None) -> str:
    """A short hash of a file's content, so the ranks of a group can tell they loaded the same one."""
    if thresholds is None:
        return ""
    return hashlib.sha256(json.dumps(thresholds.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def agree(thresholds: Thresholds | None, why: str, cpu_group) -> str:
    """One reason for the whole group: any rank's, or that the ranks loaded different files; '' when all agree.

    The group's first collective: it also compares the variables that decide which collectives run
    (env.agreed_values), and ranks that differ are one ArxtuneError on every rank, never a hang later."""
    answers = gather_objects((thresholds_digest(None if why else thresholds), why, env.agreed_values()), cpu_group)
    differ = env.differences([values for _, _, values in answers])
    if differ:
        raise ArxtuneError(differ)
    reason = agreed_reason([w for _, w, _ in answers])
    if not reason and len({digest for digest, _, _ in answers}) > 1:
        reason = "the ranks of this group loaded different thresholds files (give every node the same one)"
    return reason


def capture_check(device: torch.device) -> Callable[[], bool] | None:
    """How to tell a call made during CUDA-graph capture; CPU tensors are never captured."""
    return torch.cuda.is_current_stream_capturing if device.type == "cuda" else None


@dataclass(frozen=True)
class Loaded:
    """A group's view of its thresholds file: the file as read, and whether (why not) the group uses it."""

    file: Thresholds | None  # the file as read, even when the group cannot use it
    path: Path | None
    why: str  # '' when every rank can use the same file

    @property
    def usable(self) -> Thresholds | None:
        return None if self.why else self.file


def load_for_group(ctx: GroupContext, source: str | Path | Thresholds | None = None, model_dtype: torch.dtype | None = None) -> Loaded:
    """Read the file on every rank and agree on one verdict (a collective on ctx.cpu_group)."""
    thresholds, path, why = read_thresholds(ctx.world_size, source, model_dtype)
    return Loaded(thresholds, path, agree(thresholds, why, ctx.cpu_group))


@dataclass(frozen=True)
class Caller:
    """What a caller serves itself and what it wants opened: the one policy the dispatch starts from.

    The communicator serves the calls no range takes with a baseline backend (`own_path` ''); the vLLM
    plugin hands them back to vLLM (`own_path` "vllm", `own_framework` "vllm": ranges of the backends
    that are vLLM's own communicators are vLLM's path too)."""

    own_path: str = ""  # the name calls the caller serves itself are counted under; '': a baseline backend serves them
    own_framework: str = ""  # the caller's framework: its communicators' ranges are the caller's own path too
    baseline: str | None = None  # the baseline asked for; else the file's; else this device's torch.distributed backend
    candidates: bool = False  # a group without a file: the start-up ladder (adjust) may time each backend's start_up_candidate
    capturing: Callable[[], bool] | None = None  # default: capture_check(device)


@dataclass(frozen=True)
class Fingerprinted:
    """The file's fingerprint against the running group: what the start-up line says, and whether it differs."""

    line: str
    differs: bool = False
    strict: bool = False

    @property
    def refused(self) -> bool:
        """ARXTUNE_FINGERPRINT=strict and the file was measured on something else: no calibrated range is used."""
        return self.differs and self.strict


def fingerprint_verdict(thresholds: Thresholds | None, ctx: GroupContext) -> Fingerprinted:
    """Compare the runs behind the file's tables for this world size with the running group (a collective)."""
    strict = env.FINGERPRINT.get().lower() == "strict"
    if thresholds is None:
        return Fingerprinted("fingerprint: no file", strict=strict)
    run_ids = sorted({t.run_id for t in thresholds.tables if t.world_size == ctx.world_size and thresholds.run(t.run_id)})
    if not run_ids:
        return Fingerprinted("fingerprint not recorded", strict=strict)
    running = running_fingerprint(ctx.world_size, ctx.device, gather_objects(host_facts(ctx.device), ctx.cpu_group))
    differ = []
    for run_id in run_ids:
        run = thresholds.run(run_id)
        found = run.fingerprint.differences(running) if run else []
        if found:
            differ.append(f"run {run_id}: {', '.join(found)}")
    if not differ:
        return Fingerprinted(f"fingerprint matches run {', '.join(run_ids)}", strict=strict)
    line = "fingerprint differs (" + "; ".join(differ) + ")"
    if strict:
        return Fingerprinted(f"{line}; {env.FINGERPRINT.name}=strict: no calibrated range is used", True, True)
    return Fingerprinted(f"{line}; used anyway ({env.FINGERPRINT.name}=strict falls back instead)", True, False)


@dataclass(frozen=True)
class Started:
    """What start-up decided for one group, once, the same on every rank; the callers only read it."""

    loaded: Loaded  # the file as read and agreed on
    thresholds: Thresholds | None  # in force: the file, the ladder's under adjust, None (no file, strict fingerprint)
    fingerprint: Fingerprinted
    baseline: str  # the backend serving what no range takes ('' where the caller's own path does)
    router: Router
    line: str  # the start-up line, after "world N, "
    problems: tuple[str, ...]  # what the caller warns about
    ladder: ladder.Outcome | None = None


def baselines(caller: Caller, loaded: Loaded, device: torch.device) -> tuple[str, ...]:
    """The baseline backends, preferred first: the caller's, else the file's (even one the group cannot use),
    else this device's torch.distributed backend; then that torch.distributed backend as the one to fall back on."""
    preferred = caller.baseline or (loaded.file.baseline if loaded.file else default_baseline(device))
    return tuple(dict.fromkeys((preferred, default_baseline(device))))


class Dispatch:
    """One group's routes: per call, the backend the router picks, and the flat out-of-place call into it.

    Start-up runs once, in order: the file as agreed (`loaded`), the baselines, the fingerprint verdict,
    the start-up ladder (ARXTUNE_BOOT), the router; `started` records the outcome. ArxtuneError when the
    caller needs a baseline backend and none can run here.
    """

    def __init__(self, ctx: GroupContext, loaded: Loaded, caller: Caller = Caller()):
        self.ctx = ctx
        wanted = baselines(caller, loaded, ctx.device)
        preferred = wanted[0]

        def native(name: str) -> bool:  # ranges the caller's own path serves
            return name == preferred or (bool(caller.own_framework) and framework(name) == caller.own_framework)

        every = verify_every()
        also_open: tuple[str, ...] = () if caller.own_path else wanted
        if every and not also_open and loaded.usable is not None:
            also_open = (preferred,)  # what ARXTUNE_VERIFY compares with, where the caller opens no baseline
        thresholds, ready, outcome = loaded.usable, None, None
        policy = ladder.policy()
        if policy != "off":  # the start-up ladder (ARXTUNE_BOOT): `candidates` serve a group without a file under adjust
            thresholds, ready, outcome = self._ladder(policy, thresholds, also_open, caller.candidates, caller.own_path or preferred)
        verdict = fingerprint_verdict(thresholds, ctx)
        in_force = None if verdict.refused else thresholds
        opened = open_router(
            in_force,
            ctx,
            caller.own_path or wanted,
            native,
            caller.capturing or capture_check(ctx.device),
            also_open,
            ready=ready,
            excluded=outcome.failed if outcome else None,
            fingerprint=verdict.line,
        )
        self.opened = opened
        baseline = "" if caller.own_path else opened.router.fallback
        if baseline and baseline not in opened.backends:
            opened.close()
            raise ArxtuneError(f"baseline backend {baseline} cannot run here; pass baseline= a backend that can")
        router = opened.router
        line = opened.line + (", " + outcome.line if outcome is not None else "")
        problems = tuple(([verdict.line] if verdict.refused else []) + opened.problems)
        reference = next((opened.backends[n] for n in also_open if n in opened.backends), None)
        if every and reference is not None:
            self._verify = Verifier(self, reference, every)
            self.run = self._verify.run  # type: ignore[method-assign]  # the plain run stays the class's: no cost per call without ARXTUNE_VERIFY
            line += f", verify 1 call in {every} against {reference_name(opened.backends, reference)}"
        elif every:
            line += f", verify off ({env.VERIFY.name}: no baseline could open to compare with)"
        self.started = Started(loaded, in_force, verdict, baseline, router, line, problems, outcome)

    def _ladder(
        self, policy: str, thresholds: Thresholds | None, also_open: tuple[str, ...], candidates: bool, fallback: str
    ) -> tuple[Thresholds | None, tuple[dict, dict], ladder.Outcome]:
        """Open what the ladder times, run it, and hand the opened backends to the router; any failure keeps the file."""
        ctx = self.ctx
        since, left = None, {}
        wanted: tuple[str, ...]
        if thresholds is not None:  # what the file names opens for serving anyway: the budget starts after it
            wanted = tuple(sorted({r.backend for t in thresholds.tables if t.world_size == ctx.world_size for r in t.ranges}))
        else:  # candidates open for the ladder alone: their opening is part of its budget (asking their classes is not)
            asked = ladder.candidates(ctx.device) if candidates and policy == "adjust" else ()
            since = time.monotonic()
            named = {o.backend for o in parse_overrides(env.OVERRIDES.get())}
            wanted, left = ladder.within_reach(asked, named) if asked else ((), {})
        wanted = tuple(dict.fromkeys(also_open + wanted))
        baseline = thresholds.baseline if thresholds else (also_open[0] if also_open else fallback)
        opened, status = open_backends(wanted, backend_context(ctx, thresholds))
        try:
            outcome = ladder.run(ctx, thresholds, opened, status, policy, tuple(wanted), baseline, since=since)
        except Exception as exc:  # start-up goes on with the file as it is
            log.warning("arxtune: start-up ladder failed (%s: %s); the thresholds file is used as it is", type(exc).__name__, exc)
            outcome = ladder.Outcome(thresholds, f"ladder {policy}: failed ({type(exc).__name__})")
        if left:
            outcome.line += "; left out " + ", ".join(
                f"{name} (opening it imports {framework}, which this process has not: name it in {env.OVERRIDES.name} "
                f"or import {framework} first)"
                for name, framework in left.items()
            )
        return outcome.thresholds if policy == "adjust" else thresholds, (opened, status), outcome

    @property
    def backends(self) -> dict[str, Backend]:
        """The backends open now (none after close())."""
        return self.opened.backends

    @property
    def router(self) -> Router:
        return self.started.router

    @property
    def thresholds(self) -> Thresholds | None:
        return self.started.thresholds

    @property
    def ladder(self) -> ladder.Outcome | None:
        return self.started.ladder

    def pick(self, op: str, tensor: torch.Tensor) -> Backend | None:
        """The backend for this call by the file's tables, or None for the caller's own path (counted either way)."""
        return self.router.pick(op, tensor.dtype, OP_SPECS[op].tensor_nbytes(tensor.nbytes, self.ctx.world_size))

    def run(self, backend: Backend, op: str, tensor: torch.Tensor) -> torch.Tensor:
        """`op` of `tensor` through `backend`, out of place, shaped along dim 0 (all_reduce keeps the shape)."""
        world = self.ctx.world_size
        flat = tensor.contiguous().view(-1)
        out = torch.empty(OP_SPECS[op].out_numel(flat.numel(), world), dtype=tensor.dtype, device=tensor.device)
        getattr(backend, op)(flat, out)
        if tensor.dim() == 0:
            return out.view(tensor.shape)
        return out.view(OP_SPECS[op].out_numel(tensor.shape[0], world), *tensor.shape[1:])

    def close(self) -> None:
        """Close every backend and forget them (a second call does nothing); later calls go to the caller's path."""
        self.opened.close()
        self.__dict__.pop("run", None)
        self.__dict__.pop("_verify", None)


def verify_every() -> int:
    """ARXTUNE_VERIFY as a call count; 0 (off) when unset, and with a warning when it is not a whole number >= 1."""
    text = env.VERIFY.get()
    if not text or text == "0":
        return 0
    if text.isdigit() and len(text) < 10:
        return int(text)
    log.warning("arxtune: %s=%r is not a whole number of calls >= 1; verification is off", env.VERIFY.name, text)
    return 0


def reference_name(backends: dict, backend: Backend) -> str:
    return next((name for name, b in backends.items() if b is backend), getattr(backend, "name", "?"))


class Verifier:
    """ARXTUNE_VERIFY=N: every Nth call of each backend is made again through the reference (the baseline)
    and compared (ops.differs); a backend whose result differs on any rank is excluded by the router for that
    (op, dtype) in every mode, for good, and this call returns the reference's result. Calls while a CUDA
    graph is captured are not checked (the comparison needs the host). Every rank counts alike, so every
    rank checks the same calls: the check is a collective (the reference's call, and agreeing on the verdict)."""

    def __init__(self, dispatch: "Dispatch", reference: Backend, every: int):
        self.dispatch = dispatch
        self.reference = reference
        self.every = every
        self.calls: dict[int, int] = {}  # id(backend) -> its calls so far

    def run(self, backend: Backend, op: str, tensor: torch.Tensor) -> torch.Tensor:
        dispatch = self.dispatch
        out = Dispatch.run(dispatch, backend, op, tensor)
        if backend is self.reference or dispatch.router.mode() == "graph":
            return out
        count = self.calls[id(backend)] = self.calls.get(id(backend), 0) + 1
        if count % self.every:
            return out
        want = Dispatch.run(dispatch, self.reference, op, tensor)
        bad = differs(out, want, op, dispatch.ctx.world_size) or ""
        if not all_max(1.0 if bad else 0.0, dispatch.ctx.cpu_group):
            return out
        rank, why = next((r, b) for r, b in enumerate(gather_objects(bad, dispatch.ctx.cpu_group)) if b)
        name = reference_name(dispatch.backends, backend)
        dtype = dtype_name(tensor.dtype)
        nbytes = OP_SPECS[op].tensor_nbytes(tensor.nbytes, dispatch.ctx.world_size)
        what = f"{env.VERIFY.name}, call {count} at {format_bytes(nbytes)}: rank {rank}: {why}"
        if dispatch.router.exclude(name, op, dtype, what) and dispatch.ctx.rank == 0:
            log.warning(
                "arxtune: %s gave a wrong %s/%s result (%s); it serves no %s/%s call for the rest of this process (they go to %s)",
                name,
                op,
                dtype,
                what,
                op,
                dtype,
                dispatch.router.fallback,
            )
        return want
