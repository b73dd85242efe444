"""Does arxtune's NCCL timing agree with nccl-tests on this machine?

Takes an nccl-tests build (the directory holding all_reduce_perf; this script
builds nothing) and, in each of --rounds rounds, runs all_reduce_perf eagerly
and with CUDA graphs (`-G`, as many calls per graph as arxtune captures) on
every GPU present, then `arxtune sweep` of the NCCL backend over the same
sizes in its eager, isolated and graph views, then nccl-tests again. nccl-tests
repeats its table --cycles times (`-N`) and each size counts at its median.
Per size it prints the median over rounds of arxtune's median over the mean of
the two nccl-tests runs around it, each tool's spread over rounds (max/min of
its per-round figures) and nccl-tests against itself (its second run over its
first, median over rounds): on a shared machine the GPU's speed drifts over
minutes and the host's cost of an NCCL call differs from one process to the
next, so only figures taken side by side compare, and where nccl-tests misses
the tolerance against itself, this machine cannot judge that size to it.

nccl-tests runs as it does by default, filling and checking its buffers
(`-c 1`), as arxtune checks every result. Its times move with that flag
although the timed calls do not change: on an H100 its graph time at 1 MiB
read 2.07 us with `-c 0` and 2.44 us with `-c 1`
(results/nccl-fidelity-h100-w1). So each round
also runs it once with the other setting, printed beside (`nt -c0`), to show
how far nccl-tests' own figure moves on this machine. nccl-tests runs against
the libnccl arxtune loads (torch's, put first on LD_LIBRARY_PATH), and its
header must name that version: a build can otherwise pick up another NCCL.
With `-G N` nccl-tests times N launches of a graph it has just instantiated,
so its figure carries the graph's first launch (its upload to the GPU) spread
over N launches; arxtune times replays of a graph already launched. On an H100
with 200 calls per graph that first launch added 0.09 us per call at 8 KiB
with `-G 10` (1.25 against 1.16 us with `-G 100`, where arxtune read 1.16), so
the check launches each nccl-tests graph 100 times. Its eager figure is the
host clock from the first of `-n` launches to a stream synchronisation,
divided by `-n`; on an H100 at 8 KiB it read 7.21 us (6.07-9.65 over nine
tables) with `-n 20` and 5.35 (4.59-5.74) with `-n 200`
(results/nccl-fidelity-h100-w1/n20-n200.txt), so the check launches 200.
The target: eager and graph within 5% at 8 KiB, 1 MiB and 64 MiB.

  python benchmarks/nccl_fidelity.py --nccl-tests /path/to/nccl-tests/build --out /tmp/fidelity
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arxtune.runtime.timing import GRAPH_OPS_PER_SAMPLE  # noqa: E402

TARGET_SIZES = (8 << 10, 1 << 20, 64 << 20)
TOLERANCE = 0.05
EAGER_LAUNCHES = 200


def parse_out_of_place_us(text: str) -> dict[int, float]:
    """nccl-tests' table -> {bytes: out-of-place time in us}, the median where it printed a size more than once (-N)."""
    column, times = None, {}
    for line in text.splitlines():
        tokens = line.lstrip("#").split()
        if line.startswith("#") and tokens[:2] == ["size", "count"]:
            column = tokens.index("time") if "time" in tokens else None
        elif column is not None and tokens and tokens[0].isdigit() and len(tokens) > column:
            times.setdefault(int(tokens[0]), []).append(float(tokens[column]))
    if not times:
        raise SystemExit(f"no nccl-tests results in its output:\n{text[-2000:]}")
    return {size: statistics.median(values) for size, values in times.items()}


def arxtune_nccl() -> tuple[str, int]:
    """The libnccl file arxtune's `nccl` backend loads (torch's), and its version code."""
    import torch  # noqa: F401  (loads torch's NCCL, which the backend then finds by soname)

    from arxtune.runtime.backends.nccl_lib import NcclLibrary

    lib = NcclLibrary()
    path = lib.path()
    if path is None:
        raise SystemExit("cannot tell which libnccl arxtune loads (no single libnccl in /proc/self/maps)")
    return path, lib.version()


def library_version(text: str) -> int | None:
    """nccl-tests' header names the NCCL it runs: `nccl-library=22809`."""
    match = re.search(r"nccl-library=(\d+)", text)
    return int(match.group(1)) if match else None


def run_nccl_tests(binary: Path, args, graph: bool, library: tuple[str, int], check: int) -> dict[int, float]:
    """nccl-tests' out-of-place times of one invocation, run against arxtune's own libnccl (a build may find another one first)."""
    iters = args.graph_iters if graph else args.iters
    command = [
        str(binary),
        "-b",
        args.min_bytes,
        "-e",
        args.max_bytes,
        "-f",
        "2",
        "-d",
        args.dtype,
        "-g",
        str(args.gpus),
        "-c",
        str(check),
        "-w",
        "5",
        "-n",
        str(iters),
        "-N",
        str(args.cycles),
    ] + (["-G", str(args.graph_launches)] if graph else [])
    path, version = library
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [os.path.dirname(path), os.environ.get("LD_LIBRARY_PATH")])))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    theirs = library_version(result.stdout)
    if theirs != version:
        raise SystemExit(
            f"nccl-tests ran NCCL {theirs}, arxtune runs {version} ({path}): "
            "rebuild nccl-tests against that library (NCCL_HOME) so both time the same code"
        )
    print("nccl-tests:", " ".join(command), flush=True)
    return parse_out_of_place_us(result.stdout)


def run_arxtune(args, run_id: str) -> dict[tuple[str, int], float]:
    """{(mode, bytes): median us} of one `arxtune sweep` of the nccl backend."""
    dtype = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float": "float32", "float32": "float32", "half": "float16", "float16": "float16"}[
        args.dtype
    ]
    command = [
        sys.executable,
        "-m",
        "arxtune",
        "sweep",
        "--backends",
        "nccl",
        "--ops",
        "all_reduce",
        "--dtypes",
        dtype,
        "--views",
        "eager,isolated,graph",
        "--min-bytes",
        args.min_bytes,
        "--max-bytes",
        args.max_bytes,
        "--step-factor",
        "2",
        "--nproc-per-node",
        str(args.gpus),
        "--out",
        args.out,
        "--run-id",
        run_id,
        "--no-progress",
    ]
    print("arxtune:   ", " ".join(command), flush=True)
    subprocess.run(command, check=True, timeout=900, stdout=subprocess.DEVNULL)
    from arxtune.harness.results import load_run

    frame = load_run(Path(args.out) / run_id).frame()
    ok = frame[frame.status == "ok"]
    return {(row.view, int(row.nbytes)): float(row.median_us) for row in ok.itertuples()}


@dataclass
class Paired:
    """One (mode, size) over the rounds: medians over rounds, ratios taken within a round."""

    ours: float  # arxtune's median
    theirs: float  # nccl-tests' (the mean of its two runs in a round)
    ratio: float  # arxtune / nccl-tests
    spread_ours: float  # max / min over rounds
    spread_theirs: float
    control: float  # nccl-tests' second run / its first: what this machine's noise alone gives


def paired(rounds: list[dict], mode: str, size: int) -> Paired:
    """arxtune against the two nccl-tests runs around it in each round (`mode` and `mode + "_after"`)."""
    triples = [(r["arxtune"].get((mode, size)), r.get(mode, {}).get(size), r.get(mode + "_after", {}).get(size)) for r in rounds]
    triples = [(a, b, c) for a, b, c in triples if a and b and c]
    if not triples:
        return Paired(*[float("nan")] * 6)
    ours, theirs = [a for a, _, _ in triples], [(b + c) / 2 for _, b, c in triples]
    return Paired(
        statistics.median(ours),
        statistics.median(theirs),
        statistics.median(a / t for a, t in zip(ours, theirs)),
        max(ours) / min(ours),
        max(theirs) / min(theirs),
        statistics.median(c / b for _, b, c in triples),
    )


def within(ratio: float) -> bool:
    return abs(ratio - 1) <= TOLERANCE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nccl-tests", required=True, type=Path, help="Directory with nccl-tests' all_reduce_perf.")
    parser.add_argument("--out", required=True, help="Directory for arxtune's run.")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs (= ranks); default: all visible.")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--min-bytes", default="8K")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument(
        "--iters",
        type=int,
        default=EAGER_LAUNCHES,
        help="nccl-tests -n eagerly: enough launches that its closing synchronisation weighs little per call.",
    )
    parser.add_argument(
        "--graph-iters",
        type=int,
        default=GRAPH_OPS_PER_SAMPLE,
        help="nccl-tests -n with -G (calls per graph): as many as arxtune captures, so launches weigh alike.",
    )
    parser.add_argument(
        "--graph-launches",
        type=int,
        default=100,
        help="nccl-tests -G: enough launches that its graph's first one (the upload) weighs under 1%%.",
    )
    parser.add_argument("--cycles", type=int, default=5, help="nccl-tests -N: tables per run, each size at their median.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of (nccl-tests, arxtune, nccl-tests).")
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
        before = {mode: run_nccl_tests(binary, args, mode == "graph", library, 1) for mode in ("eager", "graph")}
        unchecked = {mode + "_c0": run_nccl_tests(binary, args, mode == "graph", library, 0) for mode in ("eager", "graph")}
        ours = run_arxtune(args, f"fidelity-{r}")
        after = {mode + "_after": run_nccl_tests(binary, args, mode == "graph", library, 1) for mode in ("eager", "graph")}
        rounds.append({**before, **unchecked, **after, "arxtune": ours})
    print(
        f"\nall_reduce {args.dtype}, {args.gpus} GPU(s), {args.rounds} rounds; us = median over rounds; ratio = median over "
        "rounds of arxtune / nccl-tests out-of-place in the same round; spread = max/min over rounds; self = nccl-tests' "
        "second run / its first; nt -c0 = nccl-tests without its data check, median over rounds"
    )
    print(
        f"{'bytes':>10} {'nt eager':>9} {'ax eager':>9} {'ratio':>6} {'spread ax/nt':>12} {'self':>6} {'nt -c0':>7} {'nt graph':>9} "
        f"{'ax graph':>9} {'ratio':>6} {'spread ax/nt':>12} {'self':>6} {'nt -c0':>7} {'ax isolated':>12}"
    )
    misses = []
    for size in sorted(rounds[0]["eager"]):  # type: ignore[call-overload]
        cells = []
        for mode in ("eager", "graph"):
            p = paired(rounds, mode, size)
            if size in TARGET_SIZES and not within(p.ratio):
                noise = "" if within(p.control) else f" (nccl-tests against itself: {p.control:.3f}, outside {TOLERANCE:.0%} too)"
                misses.append(f"{mode} {size} B: {p.ratio:.3f}{noise}")
            unchecked = _median(r.get(mode + "_c0", {}).get(size) for r in rounds)  # type: ignore[assignment, attr-defined]
            cells.append(
                f"{p.theirs:>9.2f} {p.ours:>9.2f} {p.ratio:>6.3f} {p.spread_ours:>5.2f}/{p.spread_theirs:<6.2f} {p.control:>6.3f} "
                f"{unchecked:>7.2f}"
            )
        mark = " *" if size in TARGET_SIZES else ""
        print(f"{size:>10} {cells[0]} {cells[1]} {_median(r['arxtune'].get(('isolated', size)) for r in rounds):>12.2f}{mark}")  # type: ignore[attr-defined]
    print(f"* target sizes: within {TOLERANCE:.0%} -> " + ("all met" if not misses else "missed: " + "; ".join(misses)))
    return 1 if misses else 0


def _median(values) -> float:
    present = [v for v in values if v]
    return statistics.median(present) if present else float("nan")


if __name__ == "__main__":
    sys.exit(main())
