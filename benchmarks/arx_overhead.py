"""Python software overhead of the arx all-reduce hot path, per call.

    torchrun --nproc-per-node 2 benchmarks/arx_overhead.py [--bytes 4096] [--iters 2000]

By subtraction: (a) the raw exchange a Python caller cannot avoid — post one
cached write+flag chain with pyverbs, spin on the peer's flag, reap the
completion; (b) arx's one-shot and two-shot all-reduce of the same size. (b) - (a)
is what arxtune's own code (staging copy, local sum, bookkeeping) adds per call.
Then a cProfile of the one-shot loop shows where that time goes. Needs an RDMA
device (inside the lab guest: scripts/rdma_lab/lab.sh run -- ...).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.distributed as dist

from arxtune.runtime.rdma import RdmaConfig, connect, gloo_exchange, open_transport
from arxtune.runtime.rdma.protocol import seq_of


def raw_round_us(t, nbytes: int, iters: int) -> float:
    """Median us of: post write+flag to the peer, wait for the peer's flag, reap completions lazily (as arx does)."""
    peer = t.peers[0]
    L, nic = t.layout, t.nics[t.lanes[peer][0]]  # the peer's first link, where stripe 0 goes
    qp = nic.qps[peer]
    wrs = [t._make_wrs(peer, 0, s, L.staging(s), L.inbox(s, t.rank), nbytes) for s in range(L.slots)]
    times, completed = [], 0
    for k in range(iters):
        slot = k % L.slots
        t0 = time.perf_counter()
        while completed < k - L.slots + 1:  # the slot's previous write must be done, as in arx
            completed += nic.cq.poll(1)[0]
        t._flag_src[slot] = seq_of(k)
        qp.post_send(wrs[slot][0])
        idx = L.flag_index(k, peer, 0)
        while t.flags[idx] != seq_of(k):
            pass
        completed += nic.cq.poll(4)[0]
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6


def timed_us(fn, inp, out, iters: int) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(inp, out)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6


WAITS = ("wait", "wait_sends", "poll")  # connection.py functions that spin for the peer / the NIC


def profile_breakdown(prof: cProfile.Profile, calls: int) -> list[str]:
    """Per call: arxtune's own Python (not counting spin-waits), spin-waits, torch ops, pyverbs calls."""
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # (file, line, func) -> (cc, nc, tottime, cumtime, callers)
    own = waits = torch_ops = verbs = 0.0
    for (path, _, func), (_, _, tottime, _cumtime, _) in stats.items():
        if "/arxtune/" in path:
            if path.endswith("connection.py") and func in WAITS:
                waits += tottime
            else:
                own += tottime
        elif "pyverbs" in func or "pyverbs" in path:
            verbs += tottime
        elif "torch" in func or "Tensor" in func:
            torch_ops += tottime
    per = 1e6 / calls
    return [
        "profile per one-shot call (profiling inflates Python time):",
        f"  arxtune Python, excluding spin-waits: {own * per:8.1f} us   <- the software overhead",
        f"  spin-waiting for peer flags / CQ:     {waits * per:8.1f} us",
        f"  torch ops (staging copy, local sum):  {torch_ops * per:8.1f} us",
        f"  pyverbs calls (post_send, poll):      {verbs * per:8.1f} us",
    ]


def max_over_ranks(x: float) -> float:
    t = torch.tensor(x)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = RdmaConfig.resolve({"max_bytes": max(1 << 20, args.bytes)})
    exchange = gloo_exchange(dist.group.WORLD, world)
    raw_t = open_transport(cfg, rank, world, exchange)
    coll = connect(cfg, rank, world, exchange)
    n = args.bytes // 4
    inp, out = torch.ones(n), torch.empty(n)
    for fn in (coll.all_reduce_one_shot, coll.all_reduce_two_shot):  # warm caches (WRs, views)
        for _ in range(50):
            fn(inp, out)
    dist.barrier()
    raw = max_over_ranks(raw_round_us(raw_t, args.bytes, args.iters))
    dist.barrier()
    one = max_over_ranks(timed_us(coll.all_reduce_one_shot, inp, out, args.iters))
    dist.barrier()
    two = max_over_ranks(timed_us(coll.all_reduce_two_shot, inp, out, args.iters))
    prof = cProfile.Profile()
    dist.barrier()
    prof.enable()
    for _ in range(args.iters):
        coll.all_reduce_one_shot(inp, out)
    prof.disable()
    if rank == 0:
        print(f"world={world} bytes={args.bytes} iters={args.iters} (median us per call, max over ranks)")
        print(f"raw pyverbs post+flag-spin+poll round: {raw:9.1f} us")
        print(f"arx  one-shot all_reduce:              {one:9.1f} us  -> arxtune overhead {one - raw:8.1f} us/call")
        print(f"arx2 two-shot all_reduce:              {two:9.1f} us  -> arxtune overhead {two - 2 * raw:8.1f} us/call (2 rounds)")
        for line in profile_breakdown(prof, args.iters):
            print(line)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(10)
        print(f"top functions over {args.iters} one-shot calls (tottime s):")
        print("\n".join(s.getvalue().splitlines()[4:]))
    raw_t.close()
    coll.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
