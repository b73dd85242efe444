"""Multi-rank check of the arx backends under torchrun (one launch tests many cases).

    torchrun --nproc-per-node 3 tests/rdma/device/mp_check.py [--bench] [--quick] [--arxg]

Every op x dtype x size for arx and arx2 against exact references (inputs are
small integers, so every sum is exact), bit-identity across ranks, many
consecutive calls without barriers, chunked all-gathers larger than the
buffer, striping over two devices when the machine has them, and supports()
refusing what does not fit; with --arxg, arxg's proxies over verbs with CPU
stand-in ranks (every op, exact). Prints `MP_CHECK PASS ...` on rank 0, exits 1 on
any failure. --bench adds arx/arx2 vs gloo all-reduce latency ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
import time


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: helpers

import torch
import torch.distributed as dist

from arxtune.runtime.backends import create
from arxtune.runtime.group import GroupContext
from arxtune.runtime.ops import OP_SPECS, expected_output, make_input, mismatch
from arxtune.runtime.rdma.device import read_devices

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BYTES = 1 << 20


def exact(rank: int, n: int, dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + salt)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


class Checker:
    def __init__(self, rank, world):
        self.rank, self.world, self.cases, self.failures = rank, world, 0, []

    def expect(self, ok: bool, what: str):
        self.cases += 1
        if not ok:
            self.failures.append(what)
            print(f"[rank {self.rank}] FAIL {what}", flush=True)

    def run_backend(self, be, label, sizes, salt0=0):
        w, r = self.world, self.rank
        for di, dt in enumerate(DTYPES):
            es = torch.tensor([], dtype=dt).element_size()
            for si, n in enumerate(sizes):
                salt = salt0 + 100 * di + si
                if be.supports("all_reduce", dt, n * es):
                    out = torch.full((n,), float("nan"), dtype=dt)
                    be.all_reduce(exact(r, n, dt, salt), out)
                    ref = sum(exact(q, n, dt, salt).double() for q in range(w)).to(dt)  # type: ignore[union-attr]
                    self.expect(torch.equal(out, ref), f"{label} all_reduce {dt} n={n}")
                    self.check_identical(out, f"{label} all_reduce {dt} n={n}")
                if be.supports("all_gather", dt, w * n * es):
                    out = torch.empty(w * n, dtype=dt)
                    be.all_gather(exact(r, n, dt, salt + 1), out)
                    ref = torch.cat([exact(q, n, dt, salt + 1) for q in range(w)])
                    self.expect(torch.equal(out, ref), f"{label} all_gather {dt} n={n}")
                if be.supports("reduce_scatter", dt, w * n * es):
                    out = torch.empty(n, dtype=dt)
                    be.reduce_scatter(exact(r, w * n, dt, salt + 2), out)
                    full = sum(exact(q, w * n, dt, salt + 2).double() for q in range(w)).to(dt)  # type: ignore[union-attr]
                    self.expect(torch.equal(out, full[r * n : (r + 1) * n]), f"{label} reduce_scatter {dt} n={n}")

    def check_identical(self, out, what):
        """All ranks hold the same bits (the bytes compared as int64 checksums over gloo)."""
        b = out.view(torch.uint8).to(torch.int64)
        digest = torch.stack([b.sum(), (b * torch.arange(1, b.numel() + 1)).sum()])
        everyone = [torch.empty_like(digest) for _ in range(self.world)]
        dist.all_gather(everyone, digest)
        self.expect(all(torch.equal(d, digest) for d in everyone), f"bit-identical across ranks: {what}")


def check_arxg(chk: Checker, ctx: GroupContext) -> None:
    """arxg's proxy processes over verbs between the ranks, each GPU side stood in by this CPU rank."""
    from arxtune.runtime.rdma import RdmaConfig, gloo_exchange
    from arxtune.runtime.rdma.graph import session as session_mod
    from helpers.arxg_cpu_rank import CpuRank

    session_mod.SETUP_TIMEOUT_S = 900.0  # a proxy imports torch and pyverbs: minutes under emulation
    cfg = RdmaConfig.resolve({"max_bytes": 64 << 10, "timeout_s": 120})
    session = session_mod.open_session(cfg, ctx.rank, ctx.world_size, gloo_exchange(ctx.cpu_group, ctx.world_size), "verbs")
    try:
        # the two-guest run is the native step's cross-kernel check: a silent fallback to Python must fail it
        chk.expect(session.proxy.loop == "native", f"arxg's verbs proxy runs its {session.proxy.loop!r} loop, not the C one")
        standin, world = CpuRank(session), ctx.world_size
        for salt in range(3):  # every slot used more than once
            for op in OP_SPECS:
                for dtype, n in ((torch.bfloat16, 1), (torch.bfloat16, 4096), (torch.int32, 1000)):
                    out = torch.empty(OP_SPECS[op].shapes(n, world)[1], dtype=dtype)
                    standin.run(op, make_input(op, n, ctx.rank, world, dtype, ctx.device, salt), out)
                    wrong = mismatch(out, expected_output(op, n, ctx.rank, world, dtype, salt))
                    chk.expect(wrong is None, f"arxg over verbs {op} {dtype} n={n} salt={salt}: {wrong}")
    finally:
        session.close()


def bench(ctx, backends, rank):
    """Median all-reduce latency per backend at 4 KiB, 64 KiB, 1 MiB (fp32), one run."""
    results = {}
    for name, be in backends.items():
        for nbytes in (4 << 10, 64 << 10, 1 << 20):
            if not be.supports("all_reduce", torch.float32, nbytes):
                continue
            x, out = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
            iters = 20 if nbytes >= 1 << 20 else 50
            for _ in range(5):
                be.all_reduce(x, out)
            times = []
            for _ in range(iters):
                dist.barrier(group=ctx.cpu_group)
                t0 = time.perf_counter()
                be.all_reduce(x, out)
                times.append(time.perf_counter() - t0)
            t = torch.tensor(sorted(times)[len(times) // 2])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank is the honest time
            results[(name, nbytes)] = float(t) * 1e6
    if rank == 0:
        for nbytes in (4 << 10, 64 << 10, 1 << 20):
            g = results.get(("gloo", nbytes))
            row = "  ".join(f"{n}={results[(n, nbytes)]:.0f}us" for n in backends if (n, nbytes) in results)
            ratios = "  ".join(f"{n}/gloo={results[(n, nbytes)] / g:.2f}" for n in ("arx", "arx2") if (n, nbytes) in results and g)
            print(f"BENCH all_reduce {nbytes >> 10} KiB: {row}  {ratios}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (two-node run)")
    ap.add_argument("--arxg", action="store_true", help="also arxg's verbs proxies with CPU stand-in ranks")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = GroupContext(
        rank=rank,
        world_size=world,
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        device=torch.device("cpu"),
        cpu_group=dist.group.WORLD,
        options={"arx": {"max_bytes": MAX_BYTES, "timeout_s": 60, "chunk_bytes": 16 << 10}},
    )
    chk = Checker(rank, world)
    backends = {name: create(name, ctx) for name in ("arx", "arx2")}
    # sizes in elements: tiny, odd, not divisible by world, slot-sized, gathers larger than the buffer
    sizes = (1, 2, 3, 5, 1000, 4099) if args.quick else (1, 2, 3, 5, 7, 64, 1000, 4099, 32768, 65536, 100_003)
    for i, (name, be) in enumerate(backends.items()):
        chk.run_backend(be, name, sizes, salt0=10_000 * i)
        es = 4
        chk.expect(not be.supports("all_reduce", torch.float32, MAX_BYTES + es), f"{name} refuses all_reduce > max_bytes")
        chk.expect(be.supports("all_reduce", torch.float32, MAX_BYTES), f"{name} takes all_reduce == max_bytes")
        chk.expect(not be.supports("all_reduce", torch.bool, 64), f"{name} refuses bool")
    # slot reuse: many back-to-back calls of mixed ops, no barrier between them
    be1, be2 = backends["arx"], backends["arx2"]
    bad = 0
    for i in range(300):
        n = (3, 500, 4096)[i % 3]
        x = exact(rank, n, torch.float32, 50_000 + i)
        out = torch.empty(n)
        (be1 if i % 2 else be2).all_reduce(x, out)
        bad += not torch.equal(out, sum(exact(q, n, torch.float32, 50_000 + i) for q in range(world)))  # type: ignore[arg-type]
    chk.expect(bad == 0, f"300 consecutive all-reduces without barriers: {bad} wrong")
    names = [d.name for d in read_devices()]
    if len(names) >= 2 and not args.quick:  # the "twins": stripe big writes over two devices
        tctx = GroupContext(
            rank=rank,
            world_size=world,
            local_rank=ctx.local_rank,
            device=ctx.device,
            cpu_group=ctx.cpu_group,
            options={"arx": {"devices": names[:2], "max_bytes": MAX_BYTES, "stripe_min_bytes": 4096}},
        )
        twins = create("arx", tctx)
        chk.run_backend(twins, f"arx[{'+'.join(names[:2])}]", (5, 4099, 65536), salt0=90_000)
        twins.close()
    if args.arxg:
        check_arxg(chk, ctx)
    if args.bench:
        bench(ctx, {"gloo": create("gloo", ctx), **backends}, rank)
    for be in backends.values():
        be.close()
    failures = torch.tensor(len(chk.failures))
    dist.all_reduce(failures)
    if rank == 0:
        verdict = "PASS" if int(failures) == 0 else f"FAIL ({int(failures)} failures)"
        print(f"MP_CHECK {verdict} world={world} cases_per_rank={chk.cases} host={os.uname().nodename}", flush=True)
    dist.destroy_process_group()
    return 0 if int(failures) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
