"""Start-up time the ladder adds: a Communicator's construction on a fresh gloo TP=2 group, per ARXTUNE_BOOT policy.

Each repeat is a fresh `torchrun --nproc-per-node 2` job that builds one
Communicator and reports its construction time (the slowest rank's). The
file gives a second backend ('counting': gloo that counts its calls, from
tests/helpers, since a CPU box has no other collective backend without vLLM)
all_reduce and all_gather up to 64 KiB, so `check` and `adjust` time 2
boundaries at 3 sizes each; `adjust-nofile` builds tables from the coarse
grid instead (compared with `off-nofile`). Prints the median and range per
policy, in milliseconds, and whether what the ladder adds (median against
`off`, measured around the construction: opening what the ladder alone
needs included) stays within the budget plus 10%. Run it with the venv that
has vLLM (.venv-vllm/bin/python) to see that a plain Communicator process
does not pay for importing vLLM.

    PYTHONPATH=$PWD python benchmarks/boot_ladder.py [--repeats 5] [--budget 1] [--src CHECKOUT]

Only relative figures mean something on a loaded machine; say what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KiB = 1024
POLICIES = ("off", "check", "adjust", "off-nofile", "adjust-nofile")
#: What the ladder may add to start-up: its budget plus this share.
ALLOWANCE = 0.10

CHILD = r"""
import json, os, sys, time
import torch.distributed as dist
from arxtune.runtime.communicator import Communicator
from arxtune.runtime.group import all_max
dist.init_process_group("gloo")
dist.barrier()
t0 = time.perf_counter()
comm = Communicator.from_env(sys.argv[1] if sys.argv[1] != "-" else None)
took = all_max(time.perf_counter() - t0, dist.group.WORLD)
if dist.get_rank() == 0:
    print("BOOT " + json.dumps({"construct_ms": took * 1e3, "line": comm.summary(), "vllm": "vllm" in sys.modules}), flush=True)
comm.close()
dist.barrier()
sys.stdout.flush()
os._exit(0)
"""


def thresholds(world: int) -> dict:
    ranges = [
        {"lo": 0, "hi": 64 * KiB, "backend": "counting", "source": "measured"},
        {"lo": 64 * KiB, "hi": None, "backend": "gloo", "source": "measured"},
    ]
    return {
        "kind": "arxtune-thresholds",
        "version": 2,
        "baseline": "gloo",
        "margin": 0.05,
        "provenance": {},
        "tables": [
            {"op": op, "dtype": "float32", "world_size": world, "mode": "eager", "ranges": ranges} for op in ("all_reduce", "all_gather")
        ],
        "models": [],
        "runs": [],
        "backend_setup": {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=1.0, help="ARXTUNE_BOOT_BUDGET_S")
    parser.add_argument("--src", type=Path, default=ROOT, help="checkout whose arxtune to time (an older one, to compare)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, child = Path(tmp) / "thresholds.json", Path(tmp) / "child.py"
        path.write_text(json.dumps(thresholds(2)))
        child.write_text(CHILD)
        base = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_")}
        base.update(
            PYTHONPATH=os.pathsep.join([str(args.src.resolve()), str(ROOT / "tests")]),
            OMP_NUM_THREADS="1",
            ARXTUNE_EXTRA_BACKENDS="counting=helpers.backends:CountingGloo",
            ARXTUNE_BOOT_OUT=str(Path(tmp) / "boot"),
            ARXTUNE_BOOT_BUDGET_S=str(args.budget),
            ARXTUNE_THRESHOLDS=str(Path(tmp) / "none.json"),
        )
        times: dict[str, list[float]] = {p: [] for p in POLICIES}
        lines: dict[str, str] = {}
        imported: dict[str, bool] = {}  # whether constructing it imported vLLM
        for _ in range(args.repeats):
            for policy in POLICIES:  # interleaved, so load from elsewhere falls on every policy alike
                env = {**base, "ARXTUNE_BOOT": policy.split("-")[0]}
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        "--standalone",
                        "--nproc-per-node",
                        "2",
                        str(child),
                        "-" if policy.endswith("nofile") else str(path),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    cwd=tmp,
                )
                found = [line for line in out.stdout.splitlines() if line.startswith("BOOT ")]
                if out.returncode or not found:
                    sys.exit(f"{policy}: the job failed\n{out.stdout}\n{out.stderr}")
                row = json.loads(found[-1][5:])
                times[policy].append(row["construct_ms"])
                lines[policy] = row["line"]
                imported[policy] = imported.get(policy, False) or row["vllm"]
    print(
        f"Communicator construction, gloo TP=2, budget {args.budget:g} s, median of {args.repeats} fresh jobs (ms), "
        f"vLLM {'installed' if has_vllm() else 'not installed'}:"
    )
    limit = args.budget * 1e3 * (1 + ALLOWANCE)
    for policy in POLICIES:
        t, off = times[policy], statistics.median(times["off-nofile" if policy.endswith("nofile") else "off"])
        added = statistics.median(t) - off
        verdict = "" if policy.startswith("off") else f"; {'within' if added <= limit else 'OVER'} {limit:.0f}"
        print(
            f"  {policy:14s} {statistics.median(t):8.1f}  (range {min(t):.1f}-{max(t):.1f}; added {added:+.1f}{verdict})"
            + ("  [imported vLLM]" if imported[policy] else "")
        )
    for policy in POLICIES:
        if not policy.startswith("off"):
            print(f"  {policy} start-up line: ...{lines[policy].split(', ladder ', 1)[-1]}")


def has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


if __name__ == "__main__":
    main()
