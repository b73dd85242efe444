"""Graph-mode arx (arxg) on one GPU: two ranks over the shared-memory fabric, and the handshake floor.

    python benchmarks/arx_graph.py --out results/RUN/arx_graph.csv --plot results/RUN/arx_graph.png

Two GPU ranks live in this process on one GPU, each with its own segment,
proxy process and CUDA stream; a CUDA graph holds a chain of 10 all-reduces per
rank, the two chains concurrent and meeting only through the protocol. A sample is one replay divided by 10. The
floor is a one-rank graph of 10 bare handshakes (the kernel rings the doorbell
and waits for its proxy's answer), timed in the same run. Every size's output
is checked bit for bit after timing. Prints a table, writes a CSV.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from arxtune.runtime.ops import elements_per_rank, expected_output, make_input, mismatch  # noqa: E402
from arxtune.runtime.rdma.config import RdmaConfig  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.arxg_cpu_rank import RanksOnOneGpu  # noqa: E402

OPS_PER_GRAPH = 10


def capture(fn) -> torch.cuda.CUDAGraph:
    """A graph of fn(OPS_PER_GRAPH), after one fn(1) outside the capture (it compiles the kernels)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(1)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(OPS_PER_GRAPH)
    torch.cuda.synchronize()
    return g


def time_graph(g: torch.cuda.CUDAGraph, warmup: int, samples: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(warmup + samples):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end) * 1e3 / OPS_PER_GRAPH)
    return out


def time_eager(fn, warmup: int, samples: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(warmup + samples):
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end) * 1e3)
    return out


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def plot(rows: list[dict], title: str, path: Path) -> None:
    """Median latency against size per mode, the handshake floors as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from arxtune.runtime.units import format_bytes

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, style in (("graph", "o-"), ("eager", "s--")):
        pts = [(r["bytes"], r["median_us"]) for r in rows if r["op"] == "all_reduce" and r["mode"] == mode]
        line, = ax.plot([b for b, _ in pts], [t for _, t in pts], style, label=f"all_reduce, {mode}")
        floor = next(r["median_us"] for r in rows if r["op"] == "handshake" and r["mode"] == mode)
        ax.axhline(floor, color=line.get_color(), linestyle=":", label=f"handshake floor, {mode} ({floor:.1f} us)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("median us per call")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="CSV to write (default: print only)")
    ap.add_argument("--plot", type=Path, help="image to draw (.png, .svg, .pdf)")
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=4 << 20)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=20.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("arx_graph: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype, rows = torch.bfloat16, []

    floor = RanksOnOneGpu(1, RdmaConfig(max_bytes=4096, timeout_s=a.timeout_s))
    g = capture(lambda repeat: [floor.ranks[0].handshake() for _ in range(repeat)])
    floor_us = statistics.median(time_graph(g, a.warmup, a.samples))
    floor_eager = statistics.median(time_eager(lambda: floor.ranks[0].handshake(), a.warmup, a.samples))
    floor.check()
    del g
    floor.close()
    rows.append({"op": "handshake", "mode": "graph", "bytes": 0, "median_us": floor_us})
    rows.append({"op": "handshake", "mode": "eager", "bytes": 0, "median_us": floor_eager})

    pair = RanksOnOneGpu(a.world, RdmaConfig(max_bytes=a.max_bytes, timeout_s=a.timeout_s))
    dev = torch.device("cuda", 0)
    for nbytes in sizes(a.min_bytes, a.max_bytes):
        n = elements_per_rank("all_reduce", nbytes, a.world, 2)
        ins = [make_input("all_reduce", n, r, a.world, dtype, dev) for r in range(a.world)]
        outs = [torch.full_like(i, float("nan")) for i in ins]
        g = capture(lambda repeat: pair.collective("all_reduce", ins, outs, repeat))
        graph_us = time_graph(g, a.warmup, a.samples)
        eager_us = time_eager(lambda: pair.collective("all_reduce", ins, outs), a.warmup, a.samples)
        torch.cuda.synchronize()
        pair.check()
        ref = expected_output("all_reduce", n, 0, a.world, dtype)
        bad = [m for m in (mismatch(o, ref) for o in outs) if m]
        if bad:
            print(f"arx_graph: WRONG result at {nbytes} B: {bad[0]}", file=sys.stderr)
            return 1
        for mode, xs in (("graph", graph_us), ("eager", eager_us)):
            rows.append({"op": "all_reduce", "mode": mode, "bytes": nbytes, "median_us": statistics.median(xs),
                         "p10_us": sorted(xs)[len(xs) // 10], "p90_us": sorted(xs)[len(xs) * 9 // 10]})
        del g
    pair.close()

    title = (f"arxg on {torch.cuda.get_device_name(0)}, world {a.world} over the shared-memory fabric, bf16, "
             f"{a.samples} samples each")
    print(f"{title}; handshake floor {floor_us:.2f} us in a graph, {floor_eager:.2f} us eager")
    print(f"{'op':<11} {'bytes':>9} {'mode':<6} {'median us':>10} {'p10':>8} {'p90':>8} {'x floor':>8}")
    for r in rows:
        print(f"{r['op']:<11} {r['bytes']:>9} {r['mode']:<6} {r['median_us']:>10.2f} {r.get('p10_us', float('nan')):>8.2f} "
              f"{r.get('p90_us', float('nan')):>8.2f} {r['median_us'] / floor_us:>8.2f}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["op", "mode", "bytes", "median_us", "p10_us", "p90_us"])
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {a.out}")
    if a.plot:
        plot(rows, title, a.plot)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
