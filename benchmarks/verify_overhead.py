"""What ARXTUNE_VERIFY=N costs a serving process: per-call time of routed calls, gloo TP=2.

One `torchrun --nproc-per-node 2` job builds one Communicator per setting (off, and N = 100, 10, 1),
each routing every float32 all_reduce to 'counting' (gloo that counts its calls, from tests/helpers:
a CPU box has no second collective backend without vLLM), with the ladder off. It then times
CALLS calls of 4 KiB per setting, the settings taking turns over ROUNDS rounds, each round's
figure the slowest rank's; prints the median per call and what it adds to `off`. A checked call
costs one more call through the baseline, the comparison and one small all_reduce to agree.

    PYTHONPATH=$PWD python benchmarks/verify_overhead.py [--calls 2000] [--rounds 7] [--bytes 4096]

Only relative figures mean something on a loaded machine; say what else ran.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("off", "100", "10", "1")

CHILD = r"""
import os, statistics, sys, time
import torch, torch.distributed as dist
from arxtune.runtime.communicator import Communicator
from arxtune.runtime.group import all_max
from arxtune.runtime.thresholds import Range, Table, Thresholds
calls, rounds, nbytes, settings = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
dist.init_process_group("gloo")
world = dist.get_world_size()
routed = Thresholds("gloo", 0.05, {}, (Table("all_reduce", "float32", world, (Range(0, None, "counting"),), "eager", "b", "eager"),))
comms = {}
for s in settings:
    os.environ["ARXTUNE_VERIFY"] = "" if s == "off" else s
    comms[s] = Communicator.from_env(routed)
x = torch.ones(nbytes // 4)
per_call = {s: [] for s in settings}
for r in range(rounds):
    for s in (settings if r % 2 == 0 else settings[::-1]):
        comm = comms[s]
        for _ in range(50):
            comm.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            comm.all_reduce(x)
        per_call[s].append(all_max((time.perf_counter() - t0) / calls, dist.group.WORLD) * 1e6)
if dist.get_rank() == 0:
    off = statistics.median(per_call["off"])
    print(f"ARXTUNE_VERIFY, gloo TP=2, {nbytes} B all_reduce routed to 'counting', {calls} calls x {rounds} rounds (us per call, slowest rank):")
    for s in settings:
        m = statistics.median(per_call[s])
        print(f"  {s:>4s}  {m:8.2f}  (range {min(per_call[s]):.2f}-{max(per_call[s]):.2f}; added {m - off:+.2f}, {100 * (m / off - 1):+.1f}%)")
for comm in comms.values():
    comm.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--bytes", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        child = Path(tmp) / "child.py"
        child.write_text(CHILD)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARXTUNE_")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            OMP_NUM_THREADS="1",
            ARXTUNE_BOOT="off",
            ARXTUNE_EXTRA_BACKENDS="counting=helpers.backends:CountingGloo",
        )
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(child),
                str(args.calls),
                str(args.rounds),
                str(args.bytes),
                ",".join(SETTINGS),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=tmp,
        )
        if out.returncode:
            sys.exit(f"the job failed\n{out.stdout}\n{out.stderr}")
        print(out.stdout, end="")


if __name__ == "__main__":
    main()
