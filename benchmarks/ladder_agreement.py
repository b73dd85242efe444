"""Do the `adjust` ladder's tables agree with a full sweep's, and with the next ladder's?

Takes a full sweep run (gloo and vllm_cpu on this machine, e.g. one of
benchmarks/repeatability.py's) and starts fresh gloo TP=2 jobs that each
build one Communicator under ARXTUNE_BOOT=adjust, in turn: with no file (the
ladder builds tables from its coarse grid) and with each --file given (the
ladder checks, and may move, its boundaries). Each job prints the backend
its tables pick at every eager size of the sweep. Per case it prints:

- against the sweep: agreement with the sweep's calibrated choice (the same
  backend, or medians within 5% in the sweep) and the regret of the ladder's
  pick by the sweep's medians against the calibrated choice
  (arxtune.harness.compare.regret; raw, against the fastest, beside it);
- between consecutive jobs of a case: the share of sizes picked alike.

The ladder's own runs go to --out/boot, for `arxtune compare SWEEP LADDER_RUN`.
Run it from the vLLM venv so vllm_cpu opens:

  PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/ladder_agreement.py --sweep RUN --out DIR [--file thresholds.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from arxtune.harness.calibrate import calibrate
from arxtune.harness.compare import DEFAULT_TOLERANCE, regret
from arxtune.harness.results import load_run
from arxtune.runtime.thresholds import Thresholds, load

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys
import torch, torch.distributed as dist
import vllm  # noqa: F401  (imported first: the file-less ladder opens vllm_cpu only in a process that has vLLM)
from arxtune.runtime.communicator import Communicator
dist.init_process_group("gloo")
comm = Communicator.from_env(sys.argv[1] if sys.argv[1] != "-" else None)
grid = json.loads(sys.argv[2])
picks = {f"{op} {dtype} {n}": comm.choose(op, getattr(torch, dtype), n).name for op, dtype, n in grid}
if dist.get_rank() == 0:
    print("PICKS " + json.dumps({"line": comm.summary(), "picks": picks}), flush=True)
comm.close()
dist.barrier()
sys.stdout.flush()
os._exit(0)
"""


def job(child: Path, thresholds: str, grid: list, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(child), thresholds, json.dumps(grid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = [line for line in out.stdout.splitlines() if line.startswith("PICKS ")]
    if out.returncode or not found:
        sys.exit(f"the job failed ({thresholds})\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(found[-1][len("PICKS ") :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, help="A full sweep run directory (its eager view is the reference).")
    parser.add_argument("--out", required=True, help="Directory for the ladder's runs (boot/) and a summary (ladder.json).")
    parser.add_argument("--file", action="append", default=[], help="A thresholds file the ladder checks under adjust (repeatable).")
    parser.add_argument("--repeats", type=int, default=2, help="Fresh jobs per case (consecutive ones are compared).")
    parser.add_argument("--budget", type=float, default=1.0, help="ARXTUNE_BOOT_BUDGET_S")
    args = parser.parse_args()
    run = load_run(args.sweep)
    frame = run.frame()
    frame = frame[(frame.status == "ok") & (frame.view == "eager")]
    calibrated = calibrate(run)
    rows = {key: {r.backend: r for _, r in group.iterrows()} for key, group in frame.groupby(["op", "dtype", "nbytes"])}
    grid = [[op, dtype, int(n)] for op, dtype, n in sorted(rows)]
    reference = {f"{op} {dtype} {n}": _pick(calibrated, op, dtype, n, run.meta.baseline, run.meta.world_size) for op, dtype, n in grid}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    child = out / "child.py"
    child.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        ARXTUNE_BOOT="adjust",
        ARXTUNE_BOOT_OUT=str(out / "boot"),
        ARXTUNE_BOOT_BUDGET_S=str(args.budget),
        ARXTUNE_THRESHOLDS=str(out / "none.json"),
        VLLM_DIST_IDENT=f"arxtune-ladder-agreement-{os.getpid()}",
    )
    cases = {"no file": "-", **{f"file {k + 1} ({f})": str(Path(f).resolve()) for k, f in enumerate(args.file)}}
    summary = {"sweep": str(args.sweep), "budget_s": args.budget, "cases": {}}
    print(
        f"sweep {args.sweep}: {len(grid)} eager points; calibrated choices: "
        + ", ".join(f"{b} {sum(v == b for v in reference.values())}" for b in sorted(set(reference.values())))
    )
    for case, path in cases.items():
        if path != "-":  # the file as it is, before any ladder: what `adjust` starts from
            file = load(path)
            picks = {f"{op} {dtype} {n}": _pick(file, op, dtype, n, file.baseline, run.meta.world_size) for op, dtype, n in grid}
            print(f"{case} as it is, before any ladder: against the sweep {_said(judged(picks, rows, reference), len(grid))}")
        jobs = [job(child, path, grid, env) for _ in range(args.repeats)]
        results = []
        for k, got in enumerate(jobs):
            results.append({**judged(got["picks"], rows, reference), "line": got["line"].split(", ladder ", 1)[-1]})
            print(f"{case} job {k + 1}: against the sweep {_said(results[-1], len(grid))}\n  ladder {results[-1]['line']}")
        alike = [sum(a["picks"][key] == b["picks"][key] for key in a["picks"]) / len(grid) for a, b in zip(jobs, jobs[1:])]
        print(f"{case}: consecutive jobs pick alike at " + ", ".join(f"{x:.1%}" for x in alike) + f" of {len(grid)} sizes")
        summary["cases"][case] = {"jobs": results, "consecutive_alike": alike}
    (out / "ladder.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def judged(picks: dict[str, str], rows: dict, reference: dict[str, str]) -> dict:
    """Agreement of `picks` with the sweep's calibrated choices (same backend, or the sweep's medians within
    5%), and the regret percentiles of the picks by the sweep's medians (against its choice; raw: its fastest)."""
    agree, regrets, raws = 0, [], []
    for key, pick in picks.items():
        op, dtype, n = key.split()
        here = {name: row.median_us for name, row in rows[(op, dtype, int(n))].items()}
        want = reference[key]
        ratio = here[pick] / here[want] if pick in here and want in here else float("nan")
        agree += pick == want or max(ratio, 1 / ratio) <= 1 + DEFAULT_TOLERANCE
        r, raw = regret(here, pick, want)
        regrets.append(r)
        raws.append(raw)
    return {
        "agreement": agree / len(picks),
        "regret_p90": float(np.nanpercentile(regrets, 90)),
        "regret_max": float(np.nanmax(regrets)),
        "raw_regret_p90": float(np.nanpercentile(raws, 90)),
    }


def _said(result: dict, points: int) -> str:
    return (
        f"{result['agreement']:.1%} of {points} agree; regret p90 {result['regret_p90']:.1%}, max {result['regret_max']:.1%} "
        f"(raw p90 {result['raw_regret_p90']:.1%})"
    )


def _pick(thresholds: Thresholds, op: str, dtype: str, nbytes: int, baseline: str, world: int) -> str:
    """The calibrated eager table's backend at `nbytes` (ranges include lo, exclude hi); the baseline where none."""
    for table in thresholds.tables:
        if (table.op, table.dtype, table.world_size, table.mode) == (op, dtype, world, "eager"):
            for r in table.ranges:
                if r.lo <= nbytes and (r.hi is None or nbytes < r.hi):
                    return r.backend
    return baseline


if __name__ == "__main__":
    sys.exit(main())
