"""Do two consecutive sweeps of the same grid choose the same backends?

Runs `arxtune sweep` twice, back to back, then `arxtune compare` on the two
runs and prints the agreement, the regret percentiles, each sweep's wall time
and how many measured ranges each run's thresholds hold. Exits 1 when the
agreement is below --min-agreement. The default grid is the one vLLM's CPU
path is judged on: gloo and vllm_cpu, all_reduce and all_gather, bfloat16 and
float32, 1 KiB-4 MiB, 2 ranks (run it from the vLLM venv so vllm_cpu loads).

  PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/repeatability.py --out /tmp/rep
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from arxtune.harness.calibrate import calibrate
from arxtune.harness.compare import compare_runs
from arxtune.harness.report import comparison_table, console
from arxtune.harness.results import load_run


def sweep(args, run_id: str) -> float:
    command = [
        sys.executable,
        "-m",
        "arxtune",
        "sweep",
        "--backends",
        args.backends,
        "--ops",
        args.ops,
        "--dtypes",
        args.dtypes,
        "--min-bytes",
        args.min_bytes,
        "--max-bytes",
        args.max_bytes,
        "--nproc-per-node",
        "2",
        "--out",
        args.out,
        "--run-id",
        run_id,
        "--no-progress",
    ]
    if args.point_budget_s:
        command += ["--point-budget-s", str(args.point_budget_s)]
    if args.max_extra_rounds is not None:
        command += ["--max-extra-rounds", str(args.max_extra_rounds)]
    env = {**os.environ, "VLLM_DIST_IDENT": os.environ.get("VLLM_DIST_IDENT", f"arxtune-repeat-{os.getpid()}-{run_id}")}
    start = time.monotonic()
    subprocess.run(command, env=env, check=True, timeout=args.timeout_s)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="Directory for the two runs (rep-a, rep-b).")
    parser.add_argument("--backends", default="gloo,vllm_cpu")
    parser.add_argument("--ops", default="all_reduce,all_gather")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--min-bytes", default="1KiB")
    parser.add_argument("--max-bytes", default="4MiB")
    parser.add_argument("--point-budget-s", type=float, default=None, help="Default: the sweep's own.")
    parser.add_argument("--max-extra-rounds", type=int, default=None, help="Default: the sweep's own (0 turns the top-up off).")
    parser.add_argument("--min-agreement", type=float, default=0.95)
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args()
    durations = {run_id: sweep(args, run_id) for run_id in ("rep-a", "rep-b")}
    runs = [load_run(Path(args.out) / run_id) for run_id in durations]
    comparison = compare_runs(*runs)  # type: ignore[arg-type]
    console().print(comparison_table(comparison))
    load = os.getloadavg()
    print(f"cpus {os.cpu_count()}, load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for run, (run_id, seconds) in zip(runs, durations.items()):
        tables = calibrate(run).tables
        ranges = [sum(r.source == "measured" for r in t.ranges) for t in tables]
        rounds = sorted(len(r.round_iters) for r in run.records if r.status == "ok")
        base = min(rounds) if rounds else 0
        print(
            f"{run_id}: sweep {seconds:.0f} s; thresholds: {sum(ranges)} measured ranges in {len(tables)} tables {ranges}; "
            f"rounds per point {base}-{max(rounds, default=0)}, {sum(n > base for n in rounds)} of {len(rounds)} with extra rounds"
        )
    print(comparison.summary())
    return 0 if comparison.agreement >= args.min_agreement else 1


if __name__ == "__main__":
    sys.exit(main())
