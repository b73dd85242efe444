"""The arxtune command line: thin typer commands over library functions."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from .errors import ArxtuneError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Measure collective backends, calibrate crossovers, and dispatch per call.")


def _fail(exc: Exception) -> None:
    typer.echo(f"arxtune: error: {exc}", err=True)
    raise typer.Exit(2)


def _finish(run_path: Path) -> None:
    """Calibrate and plot a finished run, printing where everything went."""
    from .calibrate import calibrate
    from .plot import plot_run
    from .results import load_run

    run = load_run(run_path)
    typer.echo(f"run:        {run.path}")
    try:
        thresholds = calibrate(run)
        typer.echo(f"thresholds: {thresholds.save(run.path / 'thresholds.json')}")
    except ArxtuneError as exc:
        thresholds = None
        typer.echo(f"thresholds: not written ({exc})")
    typer.echo(f"plot:       {plot_run(run, thresholds)}")


@app.command()
def sweep(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML sweep config (see configs/sweep/)."),
    backends: Optional[str] = typer.Option(None, help="Comma list of backends, e.g. gloo,arx,arx2."),
    ops: Optional[str] = typer.Option(None, help="Comma list: all_reduce,all_gather,reduce_scatter."),
    dtypes: Optional[str] = typer.Option(None, help="Comma list: float32,bfloat16,float16,int32."),
    modes: Optional[str] = typer.Option(None, help="Comma list: eager,graph (graph needs CUDA)."),
    min_bytes: Optional[str] = typer.Option(None, help="Smallest size, e.g. 1KiB."),
    max_bytes: Optional[str] = typer.Option(None, help="Largest size, e.g. 16MiB."),
    step_factor: Optional[float] = typer.Option(None, help="Ratio between sizes on the grid."),
    point_budget_s: Optional[float] = typer.Option(None, help="Seconds of sampling per point."),
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
    from . import distributed, launch, sweep as sweep_mod
    from .config import SweepConfig, load_config
    from .results import load_run

    try:
        base = load_config(config) if config else SweepConfig()
        cfg = base.with_overrides(backends=backends, ops=ops, dtypes=dtypes, modes=modes, min_bytes=min_bytes,
                                  max_bytes=max_bytes, step_factor=step_factor, point_budget_s=point_budget_s, out=out)
        if not distributed.under_torchrun():
            if resume:
                load_run(resume)  # a bad run directory is reported here, before any rank starts
            plan = launch.LaunchPlan(nproc_per_node, nnodes, node_rank, rdzv_endpoint)
            plan.torchrun_args()  # validate before starting anything
            code = launch.run_under_torchrun(plan, sys.argv[1:])
            if code:
                _fail(ArxtuneError(f"torchrun exited with code {code}; the lines above say which rank failed. Finished points are kept: --resume the run directory"))
            return
        path = sweep_mod.run(cfg, run_id=run_id, resume=str(resume) if resume else None, progress=progress)
        if int(os.environ["RANK"]) == 0:
            _finish(path)
    except ArxtuneError as exc:
        _fail(exc)
    # A finished rank leaves without interpreter teardown: destructors of torch's
    # communication threads have been seen to abort a rank whose work was complete.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@app.command()
def calibrate(
    run: Path = typer.Argument(..., help="Run directory under results/."),
    out: Optional[Path] = typer.Option(None, help="Thresholds file to write (default RUN/thresholds.json)."),
    baseline: Optional[str] = typer.Option(None, help="Backend others must beat (default: the run's)."),
    margin: float = typer.Option(0.05, help="Fraction by which a backend must beat the baseline's median."),
    mode: str = typer.Option("eager", help="Timing mode to calibrate from: eager or graph."),
    export: Optional[str] = typer.Option(None, help="Also print as 'csv' (NCCL-tuner style) or 'table'."),
    install: bool = typer.Option(False, help="Also write to where deployments look ($ARXTUNE_THRESHOLDS or ~/.config/arxtune/thresholds.json)."),
) -> None:
    """Turn a run into a thresholds file (which backend wins at which size).

    Example: arxtune calibrate results/RUN --margin 0.1 --export table
    """
    from .calibrate import calibrate as calibrate_run
    from .communicator import default_thresholds_path
    from .report import thresholds_table
    from .results import load_run

    try:
        loaded = load_run(run)
        thresholds = calibrate_run(loaded, baseline=baseline, margin=margin, mode=mode)
        typer.echo(f"thresholds: {thresholds.save(out or loaded.path / 'thresholds.json')}")
        if install:
            typer.echo(f"installed:  {thresholds.save(default_thresholds_path())}")
        if export == "csv":
            typer.echo(thresholds.to_csv(), nl=False)
        elif export == "table":
            from rich.console import Console

            Console().print(thresholds_table(thresholds))
        elif export is not None:
            raise ArxtuneError(f"unknown --export {export!r}; use csv or table")
    except ArxtuneError as exc:
        _fail(exc)


@app.command()
def plot(
    run: Path = typer.Argument(..., help="Run directory under results/."),
    thresholds: Optional[Path] = typer.Option(None, help="Thresholds file for the bands (default RUN/thresholds.json if present)."),
    out: Optional[Path] = typer.Option(None, help="Image to write: .png (default RUN/plot.png), .svg or .pdf."),
    mode: Optional[str] = typer.Option(None, help="Only this timing mode (eager or graph)."),
) -> None:
    """Draw latency and bus bandwidth against size, with the chosen backend per range.

    Example: arxtune plot results/RUN --out run.svg
    """
    from .plot import plot_run
    from .results import load_run
    from .thresholds import load

    try:
        loaded = load_run(run)
        default = loaded.path / "thresholds.json"
        table = load(thresholds) if thresholds else (load(default) if default.is_file() else None)
        typer.echo(f"plot: {plot_run(loaded, table, out, mode)}")
    except ArxtuneError as exc:
        _fail(exc)


@app.command()
def show(path: Path = typer.Argument(..., help="A run directory or a thresholds file.")) -> None:
    """Print a run or a thresholds file as a table.

    Example: arxtune show results/RUN
    """
    from .report import show as show_path

    try:
        show_path(path)
    except ArxtuneError as exc:
        _fail(exc)


@app.command()
def e2e(
    thresholds: Optional[Path] = typer.Option(None, help="Thresholds file for the 'thresholds' arm (default: the installed one, $ARXTUNE_THRESHOLDS or ~/.config/arxtune/thresholds.json)."),
    no_thresholds: bool = typer.Option(False, "--no-thresholds", help="No 'thresholds' arm (e.g. only --force arms)."),
    force: Optional[str] = typer.Option(None, help="Comma list of backends, each forced alone for every call in its own arm, e.g. gloo,arx."),
    model: Optional[str] = typer.Option(None, help="Model directory or name (default: the tiny Llama config shipped in configs/models, dummy weights)."),
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
    from .communicator import default_thresholds_path
    from .e2e import E2EConfig, load_result, report_lines, run_e2e

    try:
        chosen = None if no_thresholds else str(thresholds or default_thresholds_path())
        cfg = E2EConfig(thresholds=chosen, force=tuple(b for b in (force or "").split(",") if b),
                        model=model or E2EConfig.model, load_format=load_format, tensor_parallel_size=tp, dtype=dtype,
                        max_model_len=max_model_len, prompts=prompts, prompt_tokens=prompt_tokens,
                        decode_tokens=decode_tokens, rounds=rounds, repeats=repeats, out=out, timeout_s=timeout_s,
                        nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port)
        run_dir = run_e2e(cfg, run_id=run_id, say=lambda line: typer.echo(line, err=True))
        if node_rank == 0:
            for line in report_lines(load_result(run_dir)):
                typer.echo(line)
            typer.echo(f"result: {run_dir / 'e2e.json'}\nplot:   {run_dir / 'e2e.png'}")
    except ArxtuneError as exc:
        _fail(exc)


@app.command()
def doctor() -> None:
    """List RDMA devices, GIDs, limits and GPUs, and which backends can run here."""
    try:
        from .doctor import doctor as run_doctor, format_report
    except ImportError as exc:
        _fail(ArxtuneError(f"doctor is unavailable: {exc}"))
    typer.echo(format_report(run_doctor()))


def main() -> None:
    app()
