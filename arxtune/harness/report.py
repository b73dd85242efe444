"""Readable tables of runs and thresholds files, for `arxtune show`."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from arxtune.harness.compare import Comparison
from arxtune.runtime.units import format_bytes
from arxtune.harness.results import load_run
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.fileio import RUN_DATA_FILES, is_run_dir
from arxtune.runtime.router import check_names
from arxtune.runtime.thresholds import Thresholds, load


BITWISE_WORDS = {True: "yes", False: "no"}


def run_table(path: str | Path) -> RichTable:
    run = load_run(path)
    meta = run.meta
    title = (
        f"run {meta.run_id}: world {meta.world_size}, {', '.join(sorted(set(meta.hostnames)))}, "
        f"torch {meta.torch_version}, started {meta.started}, {'finished ' + meta.finished if meta.finished else 'unfinished'}"
    )
    table = RichTable(title=title, title_justify="left")
    # Whether a point's output on random data had the baseline's bits (blank: not checked, as in runs before format 5).
    bits = f"bits = {meta.baseline}"
    for column in (
        "backend",
        "op",
        "dtype",
        "view",
        "bytes",
        "median us",
        "p10-p90 us",
        "p99 us",
        "round medians us",
        "busbw GB/s",
        "iters",
        bits,
        "status",
    ):
        table.add_column(column, justify="right" if column not in ("backend", "op", "dtype", "view", bits, "status") else "left")
    for row in run.frame().itertuples():
        if row.status == "ok":
            flag = " unstable" if row.unstable else ""
            table.add_row(
                row.backend,
                row.op,
                row.dtype,
                row.view,
                format_bytes(row.nbytes),
                f"{row.median_us:.1f}",
                f"{row.p10_us:.1f}-{row.p90_us:.1f}",
                f"{row.p99_us:.1f}",
                f"{row.ci_low_us:.1f}-{row.ci_high_us:.1f}",
                f"{row.busbw_gbps:.3f}",
                f"{row.iters}/{row.rounds}r",
                BITWISE_WORDS.get(row.bitwise, ""),
                "ok" + flag,
            )
        else:
            table.add_row(row.backend, row.op, row.dtype, row.view, format_bytes(row.nbytes), *[""] * 7, f"{row.status}: {row.error}")
    for name, state in meta.backends.items():
        if not state.get("available"):
            table.add_row(name, *[""] * 11, f"unavailable: {state.get('reason', '')}")
    return table


def thresholds_table(thresholds: Thresholds) -> RichTable:
    runs = ", ".join(r.run_id for r in thresholds.runs) or "?"
    setup = "; ".join(f"{name} {s.options}" for name, s in thresholds.backend_setup.items() if s.options)
    table = RichTable(
        title=f"thresholds from runs {runs}, baseline {thresholds.baseline}, margin {thresholds.margin:.0%}"
        + (f", backends opened with {setup}" if setup else ""),
        title_justify="left",
    )
    bits = f"bits = {thresholds.baseline}"
    for column in ("mode", "op", "dtype", "world", "from (incl.)", "to (excl.)", "backend", "source", bits, "run (view)"):
        table.add_column(column)
    for t in thresholds.tables:
        for r in t.ranges:
            table.add_row(
                t.mode,
                t.op,
                t.dtype,
                str(t.world_size),
                format_bytes(r.lo),
                "inf" if r.hi is None else format_bytes(r.hi),
                r.backend,
                r.source,
                BITWISE_WORDS.get(r.bitwise, ""),
                f"{t.run_id} ({t.view})",
            )
    return table


def comparison_table(comparison: Comparison) -> RichTable:
    table = RichTable(
        title=f"choices of two runs (agree: same backend, or pooled medians within {comparison.tolerance:.0%})", title_justify="left"
    )
    for column in ("op", "dtype", "view", "bytes", "run A", "run B", "A/B pooled", "regret A", "regret B", "agree"):
        table.add_column(column, justify="right" if column in ("bytes", "A/B pooled", "regret A", "regret B") else "left")
    for p in comparison.points:
        table.add_row(
            p.op,
            p.dtype,
            p.view,
            format_bytes(p.nbytes),
            p.choice_a,
            p.choice_b,
            f"{p.pooled_ratio:.3f}",
            f"{p.regret_a:.1%}",
            f"{p.regret_b:.1%}",
            "yes" if p.agree else "NO",
        )
    return table


def console() -> Console:
    """Piped output keeps whole columns rather than the 80-column default."""
    return Console(width=None if sys.stdout.isatty() else 180)


def nccl_line(records: list[dict] | None) -> str:
    """What NCCL used in a run, in one line: the same for every rank, or per rank."""
    from arxtune.harness.nccl_facts import summary

    if not records:
        return "nccl used: not recorded (a CPU run, or a run made before results format 4)"
    lines = [summary(r) for r in records]
    if len(set(lines)) == 1:
        return f"nccl used: {lines[0]} (every rank)"
    return "nccl used: " + "; ".join(f"rank {r.get('rank', i)}: {line}" for i, (r, line) in enumerate(zip(records, lines)))


def show(path: str | Path, out: Console | None = None) -> None:
    console_ = out or console()
    path = Path(path)
    if path.name in RUN_DATA_FILES and is_run_dir(path.parent):
        raise ArxtuneError(f"{path} is part of the run in {path.parent}; show the run: arxtune show {path.parent}")
    if path.is_dir():
        console_.print(run_table(path))
        console_.print(nccl_line(load_run(path).meta.nccl_used), soft_wrap=True)
    else:
        console_.print(thresholds_table(check_names(load(path), str(path))))
