"""Does arxtune's NCCL timing agree with nccl-tests on this machine?

Takes an nccl-tests build (the directory holding all_reduce_perf; this script
builds nothing) and, in each of --rounds rounds, runs all_reduce_perf eagerly
and with CUDA graphs (`-G`, as many calls per graph as arxtune captures) on
every GPU present, then `arxtune sweep` of the NCCL backend over the same
sizes in its eager, isolated and graph views. Per size it prints the median
over rounds of arxtune's median over nccl-tests' out-of-place time in the same
round, and each tool's spread over rounds (max/min of its per-round figures):
on a shared machine the GPU's speed drifts over minutes and the host's cost of
an NCCL call differs from one process to the next, so only figures taken side
by side compare. nccl-tests runs against the libnccl arxtune loads (torch's,
put first on LD_LIBRARY_PATH), and its header must name that version: a build
can otherwise pick up another NCCL. The target: eager and graph within 5% at
8 KiB, 1 MiB and 64 MiB.

  python benchmarks/nccl_fidelity.py --nccl-tests /path/to/nccl-tests/build --out /tmp/fidelity
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arxtune.timing import EAGER_OPS_PER_SAMPLE, GRAPH_OPS_PER_SAMPLE  # noqa: E402

TARGET_SIZES = (8 << 10, 1 << 20, 64 << 20)
TOLERANCE = 0.05


def parse_out_of_place_us(text: str) -> dict[int, float]:
    """nccl-tests' table -> {bytes: out-of-place time in us}."""
    column, times = None, {}
    for line in text.splitlines():
        tokens = line.lstrip("#").split()
        if line.startswith("#") and tokens[:2] == ["size", "count"]:
            column = tokens.index("time") if "time" in tokens else None
        elif column is not None and tokens and tokens[0].isdigit() and len(tokens) > column:
            times[int(tokens[0])] = float(tokens[column])
    if not times:
        raise SystemExit(f"no nccl-tests results in its output:\n{text[-2000:]}")
    return times


def arxtune_nccl() -> tuple[str, int]:
    """The libnccl file arxtune's `nccl` backend loads (torch's), and its version code."""
    import torch  # noqa: F401  (loads torch's NCCL, which the backend then finds by soname)

    from arxtune.backends.nccl import NcclLibrary

    lib = NcclLibrary()
    path = lib.path()
    if path is None:
        raise SystemExit("cannot tell which libnccl arxtune loads (no single libnccl in /proc/self/maps)")
    return path, lib.version()


def library_version(text: str) -> int | None:
    """nccl-tests' header names the NCCL it runs: `nccl-library=22809`."""
    match = re.search(r"nccl-library=(\d+)", text)
    return int(match.group(1)) if match else None


def run_nccl_tests(binary: Path, args, graph: bool, library: tuple[str, int]) -> dict[int, float]:
    """nccl-tests' out-of-place times of one invocation, run against arxtune's own libnccl (a build may find another one first)."""
    iters = args.graph_iters if graph else args.iters
    command = [str(binary), "-b", args.min_bytes, "-e", args.max_bytes, "-f", "2", "-d", args.dtype, "-g", str(args.gpus),
               "-c", "0", "-w", "5", "-n", str(iters)] + (["-G", str(args.graph_launches)] if graph else [])
    path, version = library
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [os.path.dirname(path), os.environ.get("LD_LIBRARY_PATH")])))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    theirs = library_version(result.stdout)
    if theirs != version:
        raise SystemExit(f"nccl-tests ran NCCL {theirs}, arxtune runs {version} ({path}): "
                         "rebuild nccl-tests against that library (NCCL_HOME) so both time the same code")
    print("nccl-tests:", " ".join(command), flush=True)
    return parse_out_of_place_us(result.stdout)


def run_arxtune(args, run_id: str) -> dict[tuple[str, int], float]:
    """{(mode, bytes): median us} of one `arxtune sweep` of the nccl backend."""
    dtype = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float": "float32", "float32": "float32", "half": "float16", "float16": "float16"}[args.dtype]
    command = [sys.executable, "-m", "arxtune", "sweep", "--backends", "nccl", "--ops", "all_reduce", "--dtypes", dtype,
               "--modes", "eager,isolated,graph", "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes, "--step-factor", "2",
               "--nproc-per-node", str(args.gpus), "--out", args.out, "--run-id", run_id, "--no-progress"]
    print("arxtune:   ", " ".join(command), flush=True)
    subprocess.run(command, check=True, timeout=900, stdout=subprocess.DEVNULL)
    from arxtune.results import load_run

    frame = load_run(Path(args.out) / run_id).frame()
    ok = frame[frame.status == "ok"]
    return {(row.mode, int(row.nbytes)): float(row.median_us) for row in ok.itertuples()}


def paired(rounds: list[dict], mode: str, size: int) -> tuple[float, float, float]:
    """(median over rounds of arxtune / nccl-tests in the same round, arxtune's spread, nccl-tests' spread)."""
    pairs = [(r["arxtune"].get((mode, size)), r.get(mode, {}).get(size)) for r in rounds]
    pairs = [(a, b) for a, b in pairs if a and b]
    if not pairs:
        return float("nan"), float("nan"), float("nan")
    ours, theirs = [a for a, _ in pairs], [b for _, b in pairs]
    return statistics.median(a / b for a, b in pairs), max(ours) / min(ours), max(theirs) / min(theirs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nccl-tests", required=True, type=Path, help="Directory with nccl-tests' all_reduce_perf.")
    parser.add_argument("--out", required=True, help="Directory for arxtune's run.")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs (= ranks); default: all visible.")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--min-bytes", default="8K")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--iters", type=int, default=EAGER_OPS_PER_SAMPLE, help="nccl-tests -n eagerly (calls per timing).")
    parser.add_argument("--graph-iters", type=int, default=GRAPH_OPS_PER_SAMPLE,
                        help="nccl-tests -n with -G (calls per graph): as many as arxtune captures, so launches weigh alike.")
    parser.add_argument("--graph-launches", type=int, default=10, help="nccl-tests -G.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of (nccl-tests eager, nccl-tests graph, arxtune).")
    args = parser.parse_args()
    binary = args.nccl_tests / "all_reduce_perf"
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"{binary} is not an executable: pass the nccl-tests build directory with --nccl-tests")
    if args.gpus is None:
        import torch

        args.gpus = torch.cuda.device_count()
        if not args.gpus:
            raise SystemExit("no GPU visible: this check needs CUDA GPUs")
    library = arxtune_nccl()
    print(f"NCCL:       {library[0]} (version code {library[1]}), for nccl-tests and arxtune alike")
    rounds = []
    for r in range(args.rounds):
        rounds.append({"eager": run_nccl_tests(binary, args, False, library), "graph": run_nccl_tests(binary, args, True, library),
                       "arxtune": run_arxtune(args, f"fidelity-{r}")})
    print(f"\nall_reduce {args.dtype}, {args.gpus} GPU(s), {args.rounds} rounds; us = median over rounds of each tool's median "
          "per op; ratio = median over rounds of arxtune / nccl-tests out-of-place in the same round; spread = max/min over rounds")
    print(f"{'bytes':>10} {'nt eager':>9} {'ax eager':>9} {'ratio':>6} {'spread ax/nt':>12} {'nt graph':>9} {'ax graph':>9} "
          f"{'ratio':>6} {'spread ax/nt':>12} {'ax isolated':>12}")
    misses = []
    for size in sorted(rounds[0]["eager"]):
        cells = []
        for mode in ("eager", "graph"):
            ratio, ours, theirs = paired(rounds, mode, size)
            if size in TARGET_SIZES and not abs(ratio - 1) <= TOLERANCE:
                misses.append(f"{mode} {size} B: {ratio:.3f}")
            cells.append(f"{_median(r[mode].get(size) for r in rounds):>9.2f} "
                         f"{_median(r['arxtune'].get((mode, size)) for r in rounds):>9.2f} {ratio:>6.3f} {ours:>5.2f}/{theirs:<6.2f}")
        mark = " *" if size in TARGET_SIZES else ""
        print(f"{size:>10} {cells[0]} {cells[1]} {_median(r['arxtune'].get(('isolated', size)) for r in rounds):>12.2f}{mark}")
    print(f"* target sizes: within {TOLERANCE:.0%} -> " + ("all met" if not misses else "missed: " + "; ".join(misses)))
    return 1 if misses else 0


def _median(values) -> float:
    present = [v for v in values if v]
    return statistics.median(present) if present else float("nan")


if __name__ == "__main__":
    sys.exit(main())
