"""Start-up cost of the runtime path, in milliseconds (medians over fresh processes).

Each repeat is a new Python process (imports are cached per process) that
times, after `import torch` and `torch.distributed`:
- import arxtune.runtime.communicator,
- constructing a Communicator on a one-rank gloo group from a thresholds file,
- import arxtune.runtime.vllm_plugin alone, in a process of its own (vLLM's plugin loader imports it in every process),
and reports whether the harness (arxtune.harness.sweep, pandas, matplotlib) got imported.

    PYTHONPATH=$PWD python benchmarks/startup_cost.py [--repeats 15] [--src DIR]

--src points at another checkout (e.g. an export of an older commit) to compare.
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

# A version-1 file: every arxtune version since the format existed reads it.
THRESHOLDS = {
    "kind": "arxtune-thresholds",
    "version": 1,
    "baseline": "gloo",
    "margin": 0.05,
    "provenance": {"run_id": "benchmark", "hostnames": ["a"], "world_size": 1, "mode": "eager"},
    "tables": [
        {"op": op, "dtype": "float32", "world_size": 1, "ranges": [{"lo": 0, "hi": None, "backend": "gloo", "source": "measured"}]}
        for op in ("all_reduce", "all_gather", "reduce_scatter")
    ],
    "models": [],
}

CHILD = r"""
import json, os, sys, time
import torch, torch.distributed as dist
t0 = time.perf_counter()
try:
    import arxtune.runtime.communicator as communicator
except ImportError:  # a checkout from before the runtime/harness split
    import arxtune.communicator as communicator
t1 = time.perf_counter()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
t2 = time.perf_counter()
comm = communicator.Communicator.from_env(sys.argv[1])
t3 = time.perf_counter()
harness = sorted(m for m in ("arxtune.harness.sweep", "arxtune.harness.results", "arxtune.harness.stats", "arxtune.sweep",
                              "arxtune.results", "arxtune.timing", "pandas", "matplotlib") if m in sys.modules)
comm.close()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "construct_ms": (t3 - t2) * 1e3, "harness": harness}), flush=True)
os._exit(0)  # no gloo teardown: it is not what is measured, and it has been seen to abort
"""

PLUGIN_CHILD = r"""
import json, sys, time
import torch, torch.distributed
t0 = time.perf_counter()
try:
    import arxtune.runtime.vllm_plugin
except ImportError:  # a checkout from before the runtime/harness split
    import arxtune.vllm_plugin
t1 = time.perf_counter()
print(json.dumps({"plugin_import_ms": (t1 - t0) * 1e3}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1], help="checkout whose arxtune to time")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve()), "OMP_NUM_THREADS": "1"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "thresholds.json"
        path.write_text(json.dumps(THRESHOLDS))
        for i in range(args.repeats):
            row = {}
            for code in (CHILD, PLUGIN_CHILD):
                # cwd matters: `python -c` puts it first on sys.path.
                out = subprocess.run(
                    [sys.executable, "-c", code, str(path), str(29600 + i)],
                    env=env,
                    cwd=args.src,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=True,
                )
                row.update(json.loads(out.stdout.strip().splitlines()[-1]))
            rows.append(row)
    print(f"arxtune from {args.src} ({args.repeats} fresh processes, medians)")
    for key, label in (
        ("import_ms", "import arxtune.runtime.communicator"),
        ("construct_ms", "Communicator(1-rank gloo)"),
        ("plugin_import_ms", "import arxtune.runtime.vllm_plugin"),
    ):
        values = [r[key] for r in rows]
        print(f"  {label:<38}{statistics.median(values):8.1f} ms  (min {min(values):.1f})")
    total = [r["import_ms"] + r["construct_ms"] for r in rows]
    print(f"  {'import + construct':<38}{statistics.median(total):8.1f} ms")
    print(f"  harness modules loaded: {', '.join(rows[0]['harness']) or 'none'}")


if __name__ == "__main__":
    main()
