"""The arxtune command line: thin typer commands over library functions."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer
import typer.core

from arxtune.runtime.errors import ArxtuneError


class _OneLineErrors(typer.core.TyperGroup):
    """A flag typer cannot parse (`--margin abc`, an unknown option) is one line too, like every other error."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        from typer import _click  # the click typer ships with; its exceptions are what parsing raises

        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _click.exceptions.NoArgsIsHelpError as exc:
            exc.show()
            code = exc.exit_code
        except _click.exceptions.ClickException as exc:
            typer.echo(f"arxtune: error: {' '.join(exc.format_message().split())} (see --help)", err=True)
            code = exc.exit_code
        except typer.Abort:
            typer.echo("arxtune: error: aborted", err=True)
            code = 1
        if standalone_mode:
            sys.exit(code or 0)
        return code


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure collective backends, calibrate crossovers, and dispatch per call.",
)


def _fail(exc: Exception, code: int = 2) -> None:
    """One line on stderr, whatever the message held, and a non-zero exit."""
    message = " ".join(str(exc).split())
    if isinstance(exc, OSError) and not isinstance(exc, ArxtuneError):
        message = f"{exc.strerror or type(exc).__name__}: {exc.filename or ''}".rstrip(": ")
    typer.echo(f"arxtune: error: {message}", err=True)
    raise typer.Exit(code)


def _finish(run_path: Path) -> None:
    """Calibrate and plot a finished run, printing where everything went; an existing thresholds file is kept."""
    from arxtune.harness.calibrate import baseline_warnings, calibrate, describe_views
    from arxtune.harness.plot import plot_run
    from arxtune.harness.results import load_run
    from arxtune.runtime.thresholds import load

    from arxtune.runtime.fileio import Staged

    run = load_run(run_path)
    typer.echo(f"run:        {run.path}")
    for warning in baseline_warnings(run):
        typer.echo(f"arxtune: warning: {warning}", err=True)
    target = run.path / "thresholds.json"
    with Staged() as staged:  # the thresholds and the plot appear together, or neither
        try:
            if target.exists():
                thresholds = load(target)
                said = f"kept {target} (already there; `arxtune calibrate {run.path}` replaces it)"
            else:
                thresholds = calibrate(run)
                said = f"{staged.write_text(target, thresholds.to_text(), 'thresholds file')} ({describe_views(thresholds)})"
        except ArxtuneError as exc:
            thresholds, said = None, f"not written ({exc})"
        image = plot_run(run, thresholds, into=staged)
    typer.echo(f"thresholds: {said}")
    typer.echo(f"plot:       {image}")


def _check_resume(resume: Path, config: Optional[Path], run_id: Optional[str], overrides: dict) -> None:
    """--resume continues a run with its own config: refuse a finished run and flags that would change it."""
    from arxtune.harness.config import from_mapping
    from arxtune.harness.results import resumable
    from arxtune.runtime.fileio import check_unlocked

    run = resumable(resume)
    check_unlocked(run.path, f"run {run.path}")  # the sweep's rank 0 takes the lock; this says so before ranks start
    try:
        run_config = from_mapping(run.meta.config)
    except ArxtuneError as exc:
        raise ArxtuneError(f"run {resume} has a config this arxtune cannot use ({exc}); start a new sweep") from None
    if config or run_id:
        raise ArxtuneError(f"--resume continues {resume} with its own config and name; drop {'--config' if config else '--run-id'}")
    changed = [
        f"--{key.replace('_', '-')} (the run has {getattr(run_config, key)})"
        for key, value in overrides.items()
        if value is not None and getattr(run_config.with_overrides(**{key: value}), key) != getattr(run_config, key)
    ]
    if changed:
        raise ArxtuneError(f"--resume continues {resume} with its own config; drop {', '.join(changed)} or start a new sweep")


def _unfinished(run_path: str) -> bool:
    """Whether a run directory this node can see is there to be resumed."""
    from arxtune.harness.results import read_meta

    try:
        return bool(run_path) and not read_meta(run_path).finished
    except ArxtuneError:
        return bool(run_path)  # on another node, or damaged: still the directory to look at


def _check_runnable(cfg) -> None:
    """Refuse, before any rank starts, a sweep of which every backend or every view cannot run on this machine."""
    from arxtune.harness.doctor import backend_reasons
    from arxtune.runtime.timing import has_timer
    from arxtune.harness.launch import local_device_type

    import torch

    reasons = backend_reasons()
    if all(reasons.get(name) for name in cfg.backends):
        why = "; ".join(f"{name}: {reasons[name]}" for name in cfg.backends)
        raise ArxtuneError(f"none of the backends asked for can run on this machine ({why}); `arxtune doctor` lists what can")
    device = torch.device(local_device_type())
    if not any(has_timer(device, view) for view in cfg.views):
        raise ArxtuneError(
            f"none of the views asked for ({', '.join(cfg.views)}) can be timed with {device.type} tensors "
            f"(graph and decode need CUDA); use --views eager,isolated"
        )


def _launch_failure(result) -> str:
    """The one line the parent prints when torchrun did not finish cleanly."""
    resume = f"finished points are kept: continue with `arxtune sweep --resume {result.run_path}`" if _unfinished(result.run_path) else ""
    if result.interrupted:
        return f"interrupted; {resume}" if resume else "interrupted before the run directory was made; nothing was written"
    if result.errors:
        said = " | ".join(result.errors)
        return f"{said}; {resume}" if resume and "--resume" not in said else said
    what = result.last_exception or "no error line"
    return f"a rank failed (torchrun exit {result.code}): {what}; every rank's output: {result.log_path}" + (
        f"; {resume}" if resume else ""
    )


@app.command()
def sweep(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML sweep config (see configs/sweep/)."),
    backends: Optional[str] = typer.Option(None, help="Comma list of backends, e.g. gloo,arx,arx2."),
    ops: Optional[str] = typer.Option(None, help="Comma list: all_reduce,all_gather,reduce_scatter."),
    dtypes: Optional[str] = typer.Option(None, help="Comma list: float32,bfloat16,float16,int32."),
    views: Optional[str] = typer.Option(None, help="Comma list of timing views: eager,isolated,graph,decode (graph and decode need CUDA)."),
    decode_busy_us: Optional[float] = typer.Option(
        None, help="The decode view's GPU busy kernel before each call, in microseconds (default 50)."
    ),
    modes: Optional[str] = typer.Option(None, hidden=True, help="Old name of --views."),
    min_bytes: Optional[str] = typer.Option(None, help="Smallest size, e.g. 1KiB."),
    max_bytes: Optional[str] = typer.Option(None, help="Largest size, e.g. 16MiB."),
    step_factor: Optional[float] = typer.Option(None, help="Ratio between sizes on the grid."),
    point_budget_s: Optional[float] = typer.Option(None, help="Seconds of sampling per point."),
    max_extra_rounds: Optional[int] = typer.Option(
        None, help="Rounds a point may add where the baseline and a challenger are close (0: none)."
    ),
    out: Optional[str] = typer.Option(None, help="Directory for runs (default results/)."),
    resume: Optional[Path] = typer.Option(None, help="Continue an interrupted run directory."),
    nproc_per_node: Optional[int] = typer.Option(None, help="Ranks on this node (default: one per GPU, else 2)."),
    nnodes: int = typer.Option(1, help="Nodes in the job; >1 needs --rdzv-endpoint."),
    node_rank: Optional[int] = typer.Option(None, help="This node's rank (optional with c10d rendezvous)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="HOST:PORT every node can reach."),
    run_id: Optional[str] = typer.Option(None, help="Name of the run directory (default: time, host, world, device)."),
    progress: bool = typer.Option(True, help="Show a progress bar on rank 0."),
) -> None:
    """Time every backend across ops, dtypes and sizes; write a run, its thresholds and plot.

    Examples:

      arxtune sweep                                   # this machine, every backend it has

      arxtune sweep -c configs/sweep/cpu-smoke.toml --max-bytes 1MiB

      torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint node0:29500 -m arxtune sweep -c configs/sweep/gb10-2node.toml
    """
    from arxtune.harness import distributed
    from arxtune.runtime import backends as backend_registry, env
    from arxtune.harness import launch, sweep as sweep_mod
    from arxtune.harness.config import SweepConfig, load_config
    from arxtune.runtime.fileio import check_name, check_run_folder

    try:
        backend_registry.check_extra()
        if env.problems():
            raise ArxtuneError("; ".join(env.problems()))
        # Said once: by rank 0 under torchrun (the launcher passes its line on), never by the launcher as well.
        base = load_config(config, warn=distributed.under_torchrun() and os.environ.get("RANK") == "0") if config else SweepConfig()
        if views is not None and modes is not None:
            raise ArxtuneError("--modes is the old name of --views; give only --views")
        overrides = dict(
            backends=backends,
            ops=ops,
            dtypes=dtypes,
            views=views if views is not None else modes,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            step_factor=step_factor,
            point_budget_s=point_budget_s,
            max_extra_rounds=max_extra_rounds,
            out=out,
            decode_busy_us=decode_busy_us,
        )
        cfg = base.with_overrides(**overrides)
        if run_id is not None:
            check_name(run_id, "--run-id")
        if not distributed.under_torchrun():
            plan = launch.LaunchPlan(nproc_per_node, nnodes, node_rank, rdzv_endpoint, timeout_s=cfg.timeout_s)
            plan.torchrun_args()  # validate before starting anything
            if resume:
                _check_resume(resume, config, run_id, overrides)  # before any rank starts
            else:
                check_run_folder(cfg.out, "--out directory")
                _check_runnable(cfg)
            result = launch.run_under_torchrun(plan, sys.argv[1:])
            if result.code or result.interrupted:
                _fail(ArxtuneError(_launch_failure(result)), 130 if result.interrupted else 2)
            return
        path = sweep_mod.run(cfg, run_id=run_id, resume=str(resume) if resume else None, progress=progress)
        if int(os.environ["RANK"]) == 0:
            _finish(path)
    except (ArxtuneError, OSError) as exc:
        _fail(exc)
    # A finished rank leaves without interpreter teardown: destructors of torch's
    # communication threads have been seen to abort a rank whose work was complete.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@app.command()
def calibrate(
    runs: list[Path] = typer.Argument(..., help="Run directories under results/ (several world sizes and views merge into one file)."),
    out: Optional[Path] = typer.Option(
        None, help="Thresholds file to write (default RUN/thresholds.json for one run; needed for several)."
    ),
    baseline: Optional[str] = typer.Option(None, help="Backend others must beat (default: the runs')."),
    margin: float = typer.Option(0.05, help="Fraction by which a backend must beat the baseline's median."),
    eager_from: Optional[str] = typer.Option(
        None,
        help="Timing view the eager table comes from: decode (each call behind a GPU busy kernel; the default where the run has it), eager (back-to-back calls; the default otherwise) or isolated (one call, host cost included).",
    ),
    graph_from: str = typer.Option("graph", help="Timing view the graph table (used during CUDA-graph capture) comes from."),
    prefer: Optional[str] = typer.Option(None, help="The run (id or directory) that wins where runs conflict."),
    export: Optional[str] = typer.Option(
        None,
        help="Also print as 'csv' (arxtune's ranges, one line each) or 'table', or write "
        "'nccl-tuner' (the policy file of arxtune's NCCL tuner plugin, see --tuner-out).",
    ),
    tuner_out: Optional[Path] = typer.Option(
        None, help="Where --export nccl-tuner writes (default: nccl-tuner.csv beside the thresholds file)."
    ),
    tuner_mode: str = typer.Option("eager", help="The runtime mode whose tables --export nccl-tuner exports (eager or graph)."),
    tuner_dtype: Optional[str] = typer.Option(
        None, help="The dtype whose tables --export nccl-tuner exports (default: bfloat16, else float16, float32)."
    ),
    install: bool = typer.Option(
        False, help="Also write to where deployments look ($ARXTUNE_THRESHOLDS or ~/.config/arxtune/thresholds.json)."
    ),
    invariant: bool = typer.Option(
        False,
        help="Route only to backends that gave the baseline's bits on the sweep's random data: "
        "results independent of the backend choice (what vLLM's batch-invariant mode needs).",
    ),
) -> None:
    """Turn runs into one thresholds file (which backend wins at which size, per mode and world size).

    Examples:

      arxtune calibrate results/RUN --margin 0.1 --export table

      arxtune calibrate results/RUN --export nccl-tuner    # then NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE (docs/nccl-tuner.md)

      arxtune calibrate results/TP2 results/TP4 results/TP8 --out thresholds.json --install

      arxtune calibrate results/OLD results/NEW --prefer NEW --out thresholds.json

      arxtune calibrate results/TP4 --invariant --install   # for VLLM_BATCH_INVARIANT=1
    """
    from arxtune.harness.calibrate import DEFAULT_VIEWS, baseline_warnings, calibrate as calibrate_runs, describe_views
    from arxtune.runtime.dispatch import default_thresholds_path
    from arxtune.harness.report import thresholds_table
    from arxtune.harness.results import load_run

    from arxtune.runtime.fileio import Staged, check_output
    from arxtune.runtime.nccl_tuner import is_tuner_file, tuner_csv
    from arxtune.runtime.thresholds import is_thresholds_file

    try:
        # Every option and input is checked, and every output computed, before the first byte is written.
        if export not in (None, "csv", "table", "nccl-tuner"):
            raise ArxtuneError(f"unknown --export {export!r}; use csv, table or nccl-tuner")
        _check_tuner_options(tuner_mode, tuner_dtype)
        if len(runs) > 1 and out is None and not install:
            raise ArxtuneError("several runs make one file: say where it goes with --out FILE (or --install)")
        if export == "nccl-tuner" and tuner_out is None and out is None and len(runs) > 1:
            raise ArxtuneError("say where the NCCL tuner file goes with --tuner-out FILE")
        loaded = [load_run(run) for run in runs]
        inputs = [run.path for run in loaded]
        target = (
            check_output(out if out is not None else loaded[0].path / "thresholds.json", "--out", inputs, is_thresholds_file)
            if out is not None or len(loaded) == 1
            else None
        )
        installed = check_output(default_thresholds_path(), "install target", inputs, is_thresholds_file) if install else None
        tuner_target = None
        if export == "nccl-tuner":
            tuner_target = check_output(tuner_out or target.with_name("nccl-tuner.csv"), "--tuner-out", inputs, is_tuner_file)
        views = {"eager": (eager_from,) if eager_from else DEFAULT_VIEWS["eager"], "graph": (graph_from,)}
        thresholds = calibrate_runs(loaded, baseline=baseline, margin=margin, views=views, prefer=prefer, invariant=invariant)  # type: ignore[arg-type]
        for warning in baseline_warnings(loaded, baseline):
            typer.echo(f"arxtune: warning: {warning}", err=True)
        text = thresholds.to_text()
        tuner = tuner_csv(thresholds, tuner_mode, tuner_dtype) if tuner_target is not None else None
        with Staged() as staged:  # published together once every file is written; a failure changes none
            for path, what in ((target, "thresholds file"), (installed, "installed thresholds file")):
                if path is not None:
                    staged.write_text(path, text, what)
            if tuner is not None:
                staged.write_text(tuner_target, tuner.text, "NCCL tuner file")
        if target is not None:
            typer.echo(f"thresholds: {target} ({describe_views(thresholds)})")
        if install:
            typer.echo(f"installed:  {installed}")
        if tuner is not None:
            _say_tuner_file(tuner, tuner_target, tuner_mode)
        if export == "csv":
            typer.echo(thresholds.to_csv(), nl=False)
        elif export == "table":
            from rich.console import Console

            Console().print(thresholds_table(thresholds))
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


def _check_tuner_options(mode: str, dtype: Optional[str]) -> None:
    """--tuner-mode and --tuner-dtype name a runtime mode and a dtype arxtune knows (the file is checked later)."""
    from arxtune.runtime.ops import DTYPES
    from arxtune.runtime.thresholds import MODES

    if mode not in MODES:
        raise ArxtuneError(f"unknown --tuner-mode {mode!r}; use {' or '.join(MODES)}")
    if dtype is not None and dtype not in DTYPES:
        raise ArxtuneError(f"unknown --tuner-dtype {dtype!r}; use one of {', '.join(DTYPES)}")


def _say_tuner_file(export, target: Path, mode: str) -> None:
    """Where the NCCL tuner plugin's policy file went, and how to turn the plugin on."""
    from arxtune.runtime.nccl_tuner import CONFIG_ENV, PLUGIN_ENV

    chosen = ", ".join(f"{op} w{world} {d}" for (op, world), d in export.dtypes.items())
    typer.echo(
        f"nccl tuner: {target} ({export.rules} rules from the {mode} tables: {chosen}"
        + ("; no NCCL variant won a range, so NCCL keeps its own choice everywhere" if not export.rules else "")
        + ")"
    )
    typer.echo(f"            turn it on: {PLUGIN_ENV}=$(arxtune nccl-tuner build) {CONFIG_ENV}={target.resolve()}")


nccl_tuner_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="arxtune's NCCL tuner plugin: build it, export its policy file."
)
app.add_typer(nccl_tuner_app, name="nccl-tuner")


@nccl_tuner_app.command("build")
def nccl_tuner_build() -> None:
    """Compile the plugin (once per source and machine) and print the path of its .so, for NCCL_TUNER_PLUGIN."""
    from arxtune.runtime.nccl_tuner import build

    try:
        typer.echo(str(build()))
    except ArxtuneError as exc:
        _fail(exc)


@nccl_tuner_app.command("export")
def nccl_tuner_export(
    thresholds: Path = typer.Argument(..., help="A thresholds file (arxtune calibrate's output)."),
    out: Path = typer.Option(..., help="The CSV file to write, for NCCL_TUNER_CONFIG_FILE."),
    mode: str = typer.Option("eager", help="The runtime mode whose tables are exported (eager or graph)."),
    dtype: Optional[str] = typer.Option(None, help="The dtype whose tables are exported (default: bfloat16, else float16, float32)."),
) -> None:
    """Write the NCCL part of a thresholds file (the ranges NCCL variants won) as the plugin's policy file.

    Example: arxtune nccl-tuner export results/RUN/thresholds.json --out nccl-tuner.csv
    """
    from arxtune.runtime.fileio import check_output, write_text_atomic
    from arxtune.runtime.nccl_tuner import is_tuner_file, tuner_csv
    from arxtune.runtime.thresholds import load
    from arxtune.runtime.router import check_names

    try:
        _check_tuner_options(mode, dtype)
        loaded = check_names(load(thresholds), str(thresholds))
        target = check_output(out, "--out", [thresholds], is_tuner_file)
        export = tuner_csv(loaded, mode, dtype)
        write_text_atomic(target, export.text, "NCCL tuner file")
        _say_tuner_file(export, target, mode)
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


@app.command()
def compare(
    run_a: Path = typer.Argument(..., help="A run directory."),
    run_b: Path = typer.Argument(..., help="Another run of the same grid."),
    baseline: Optional[str] = typer.Option(None, help="Backend others must beat (default: the runs')."),
    margin: float = typer.Option(0.05, help="Margin of the decision rule, as in calibrate."),
    tolerance: float = typer.Option(0.05, help="Different choices still agree when their pooled medians are within this fraction."),
    min_agreement: float = typer.Option(0.0, help="Exit 1 when the fraction of points that agree is below this, e.g. 0.95."),
    points: bool = typer.Option(True, help="Print the per-point table."),
) -> None:
    """Whether two runs choose the same backend at each point, and what one run's choice costs by the other's medians.

    Example: arxtune compare results/RUN1 results/RUN2 --min-agreement 0.95
    """
    from arxtune.harness.compare import compare_runs
    from arxtune.harness.report import comparison_table, console
    from arxtune.harness.results import load_run

    try:
        if not (math.isfinite(min_agreement) and 0 <= min_agreement <= 1):
            raise ArxtuneError(f"--min-agreement must be a fraction from 0 to 1 (e.g. 0.95), not {min_agreement}")
        comparison = compare_runs(load_run(run_a), load_run(run_b), baseline=baseline, margin=margin, tolerance=tolerance)
    except ArxtuneError as exc:
        _fail(exc)
    if points:
        console().print(comparison_table(comparison))
    typer.echo(comparison.summary())
    if comparison.agreement < min_agreement:
        typer.echo(f"arxtune: agreement {comparison.agreement:.1%} is below --min-agreement {min_agreement:.1%}", err=True)
        raise typer.Exit(1)


@app.command()
def plot(
    run: Path = typer.Argument(..., help="Run directory under results/."),
    thresholds: Optional[Path] = typer.Option(None, help="Thresholds file for the bands (default RUN/thresholds.json if present)."),
    out: Optional[Path] = typer.Option(None, help="Image to write: .png (default RUN/plot.png), .svg or .pdf."),
    view: Optional[str] = typer.Option(None, help="Only this timing view (eager, isolated or graph)."),
    mode: Optional[str] = typer.Option(None, hidden=True, help="Old name of --view."),
) -> None:
    """Draw latency and bus bandwidth against size, with the chosen backend per range.

    Example: arxtune plot results/RUN --out run.svg
    """
    from arxtune.harness.plot import plot_run
    from arxtune.harness.results import load_run
    from arxtune.runtime.thresholds import load
    from arxtune.runtime.router import check_names

    try:
        if view is not None and mode is not None:
            raise ArxtuneError("--mode is the old name of --view; give only --view")
        loaded = load_run(run)
        default = loaded.path / "thresholds.json"
        table = check_names(load(thresholds), str(thresholds)) if thresholds else (load(default) if default.exists() else None)
        typer.echo(f"plot: {plot_run(loaded, table, out, view if view is not None else mode, (thresholds,) if thresholds else ())}")
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


@app.command()
def show(path: Path = typer.Argument(..., help="A run directory or a thresholds file.")) -> None:
    """Print a run or a thresholds file as a table.

    Example: arxtune show results/RUN
    """
    from arxtune.harness.report import show as show_path

    try:
        show_path(path)
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


@app.command()
def e2e(
    thresholds: Optional[Path] = typer.Option(
        None,
        help="Thresholds file for the 'thresholds' arm (default: the installed one, $ARXTUNE_THRESHOLDS or ~/.config/arxtune/thresholds.json).",
    ),
    no_thresholds: bool = typer.Option(False, "--no-thresholds", help="No 'thresholds' arm (e.g. only --force arms)."),
    force: Optional[str] = typer.Option(
        None, help="Comma list of backends, each forced alone for every call in its own arm, e.g. gloo,arx."
    ),
    model: Optional[str] = typer.Option(
        None, help="Model directory or name (default: the tiny Llama config shipped with arxtune, dummy weights)."
    ),
    load_format: str = typer.Option("", help="vLLM load format (default: dummy for a directory without weights)."),
    tp: int = typer.Option(2, "--tp", help="Tensor-parallel size (across all nodes)."),
    dtype: str = typer.Option("bfloat16", help="Model dtype."),
    max_model_len: int = typer.Option(256, help="vLLM max_model_len."),
    prompts: int = typer.Option(4, help="Prompts per batch."),
    prompt_tokens: int = typer.Option(16, help="Tokens per prompt."),
    decode_tokens: int = typer.Option(32, help="Tokens generated per prompt (greedy)."),
    rounds: int = typer.Option(5, help="Timed batches per engine, after one warm-up batch."),
    repeats: int = typer.Option(2, help="Engines per arm; arms alternate A B A B."),
    out: str = typer.Option("results", help="Directory for e2e runs."),
    run_id: Optional[str] = typer.Option(None, help="Name of the run directory (default: e2e-TIME-HOST-tpN)."),
    timeout_s: float = typer.Option(900.0, help="Seconds one engine may take (start-up and all rounds)."),
    nnodes: int = typer.Option(1, help="Nodes (vLLM's multiprocessing multi-node launch); run the same command on each."),
    node_rank: int = typer.Option(0, help="This node's rank; 0 runs the engine and writes the result."),
    master_addr: str = typer.Option("127.0.0.1", help="Address of node 0, reachable from every node."),
    master_port: int = typer.Option(29501, help="Port on node 0 for vLLM's process group."),
) -> None:
    """Run vLLM's engine with and without the thresholds; compare decode time per token and tokens.

    Run it with the Python that has vLLM (e.g. .venv-vllm/bin/arxtune). Examples:

      arxtune e2e --thresholds results/RUN/thresholds.json

      arxtune e2e --no-thresholds --force gloo --repeats 3

      arxtune e2e --model /models/llama --tp 2 --nnodes 2 --node-rank 0 --master-addr node0   # and --node-rank 1 on node1
    """
    from arxtune.runtime.backends import split_names
    from arxtune.runtime.dispatch import default_thresholds_path
    from arxtune.harness.e2e import E2EConfig, failures, load_result, report_lines, run_e2e

    try:
        chosen = None if no_thresholds else str(thresholds or default_thresholds_path())
        cfg = E2EConfig(
            thresholds=chosen,
            force=tuple(split_names(force or "")),
            model=model or E2EConfig.model,
            load_format=load_format,
            tensor_parallel_size=tp,
            dtype=dtype,
            max_model_len=max_model_len,
            prompts=prompts,
            prompt_tokens=prompt_tokens,
            decode_tokens=decode_tokens,
            rounds=rounds,
            repeats=repeats,
            out=out,
            timeout_s=timeout_s,
            nnodes=nnodes,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
        )
        run_dir = run_e2e(cfg, run_id=run_id, say=lambda line: typer.echo(line, err=True))
        if node_rank == 0:
            result = load_result(run_dir)
            for line in report_lines(result):
                typer.echo(line)
            typer.echo(f"result: {run_dir / 'e2e.json'}\nplot:   {run_dir / 'e2e.png'}")
            failed = failures(result)
            if failed:
                _fail(ArxtuneError("; ".join(failed)), code=1)
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


@app.command()
def doctor(
    json_out: bool = typer.Option(False, "--json", help="The same rows as JSON (one object per row)."),
    report: Optional[Path] = typer.Option(
        None, help="Also write one archive to attach to a report (rows, versions, sysfs, NCCL settings; nothing secret)."
    ),
    nproc_per_node: Optional[int] = typer.Option(None, help="Ranks on this node for the group doctor (one per box is the usual)."),
    nnodes: int = typer.Option(1, help="Boxes in the group; >1 runs doctor across them (needs --rdzv-endpoint)."),
    node_rank: Optional[int] = typer.Option(None, help="This node's rank (optional with c10d rendezvous)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="HOST:PORT every box can reach (rank 0's ConnectX address)."),
    timeout_s: float = typer.Option(60.0, help="Across the boxes: how long any rank or ping-pong answer is waited for."),
) -> None:
    """Check this box (or, under torchrun or with --nnodes, every box and each pair) and say the fix for each failure.

    Exit code 1 when a row fails, 2 on bad input. Examples:

      arxtune doctor                                   # this box, one row per check

      arxtune doctor --json > doctor.json

      arxtune doctor --nnodes 2 --nproc-per-node 1 --rdzv-endpoint spark0:29500 --report doctor.tgz   # on each box

      torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint spark0:29500 -m arxtune doctor
    """
    from arxtune.harness import distributed
    from arxtune.runtime import backends as backend_registry, env

    try:
        from arxtune.harness import doctor as doc
        from arxtune.harness.doctor import report as doc_report
    except ImportError as exc:
        _fail(ArxtuneError(f"doctor is unavailable: {exc}"))
    try:
        backend_registry.check_extra()
        if env.problems():
            raise ArxtuneError("; ".join(env.problems()))
        if not (math.isfinite(timeout_s) and 0 < timeout_s <= 24 * 3600):
            raise ArxtuneError(f"--timeout-s must be a number of seconds above 0, not {timeout_s}")
        if report is not None:
            doc_report.check_output(report, "--report", (), doc_report._is_report)
        if distributed.under_torchrun():
            _doctor_group(timeout_s, report, json_out)
            return
        if nnodes > 1 or nproc_per_node is not None:
            from arxtune.harness import launch

            plan = launch.LaunchPlan(nproc_per_node or 1, nnodes, node_rank, rdzv_endpoint, timeout_s=timeout_s)
            plan.torchrun_args()
            result = launch.run_under_torchrun(plan, sys.argv[1:])
            if result.interrupted:
                _fail(ArxtuneError("interrupted"), 130)
            if result.code:
                if result.errors:
                    typer.echo(f"arxtune: error: {' | '.join(result.errors)}", err=True)
                raise typer.Exit(1)
            return
        rows = doc.doctor()
        if report is not None:
            written = doc_report.write(report, rows)
        if json_out:
            import json

            typer.echo(json.dumps([r.as_dict() for r in rows], indent=2, default=str))
        else:
            typer.echo(doc.format_rows(rows))
            exports = next((r.data["values"] for r in rows if r.item == "nccl for the pair" and r.data.get("values")), None)
            if exports:
                typer.echo("\n# NCCL for this box's pair (each box its own; the GID index moves after reboots):")
                typer.echo("\n".join(f"export {k}={v}" for k, v in exports.items()))
        if report is not None:
            typer.echo(f"report: {written}", err=json_out)
    except (ArxtuneError, OSError) as exc:
        _fail(exc)
    if doc.failed(rows):
        raise typer.Exit(1)


def _doctor_group(timeout_s: float, report: Optional[Path], json_out: bool) -> None:
    """One rank of the group doctor; rank 0 prints, writes the report and decides the exit code."""
    import json

    from arxtune.harness.doctor import group, report as doc_report

    say = (lambda line: None) if json_out else typer.echo
    code, rows, reports, pings = group.run_group(timeout_s, say=say)
    if int(os.environ["RANK"]) == 0:
        data = {
            "rows": [r.as_dict() for r in rows],
            "reports": reports,
            "pingpong": {f"{i}-{j}": v for (i, j), v in pings.items()},
            "table": [{"what": k, "values": v, "differs": d} for k, v, d in group.table(reports)] if reports else [],
        }
        if json_out:
            typer.echo(json.dumps(data, indent=2, default=str))
        if report is not None:
            own = [doc_report.Row(**r) for r in reports[0]["rows"]] if reports else []
            typer.echo(f"report: {doc_report.write(report, own, group=data)}", err=json_out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


pyverbs_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="pyverbs for this Python: the registry's pyverbs built with its own libibverbs (the rdma extra).",
)
app.add_typer(pyverbs_app, name="pyverbs")


@pyverbs_app.command("install")
def pyverbs_install(
    cache: Optional[Path] = typer.Option(None, help="Where built wheels are kept (default ~/.cache/arxtune/pyverbs)."),
) -> None:
    """Build the wheel once (a few minutes; needs gcc and python3-dev), then pip-install it here.

    Example: arxtune pyverbs install && arxtune doctor
    """
    from arxtune.harness import pyverbs_wheel

    try:
        pyverbs_wheel.install(cache, say=lambda line: typer.echo(line, err=True))
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


@pyverbs_app.command("build")
def pyverbs_build(
    cache: Optional[Path] = typer.Option(None, help="Where built wheels are kept (default ~/.cache/arxtune/pyverbs)."),
) -> None:
    """Build (or find) the wheel and print its path, for pip install --find-links."""
    from arxtune.harness import pyverbs_wheel

    try:
        typer.echo(str(pyverbs_wheel.build(cache, say=lambda line: typer.echo(line, err=True))))
    except (ArxtuneError, OSError) as exc:
        _fail(exc)


def main() -> None:
    app()
