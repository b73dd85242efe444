"""Three ranks on three hosts: reachability, an arx sweep and the communicator, per topology, in one launch.

    RANK=R WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=... MASTER_PORT=... python tests/rdma/device/world3_check.py --out DIR \
        --topology ring=rxe0,rxe1 --topology switch=rxe2,rxe3 --unreachable rxe0

(torchrun's variables set by hand: torchrun's own agent would import torch once more in each guest,
a minute under emulation; torchrun --nnodes 3 ... runs it too.)

The three-guest lab (scripts/rdma_lab/lab.sh run3) gives each guest a ring (rxe0, rxe1: one
point-to-point cable and subnet per pair of guests) and a switch (rxe2, rxe3: one segment, one
subnet). Per topology, arx pinned to its devices: rank 0 prints the reachability matrix; a sweep of
gloo, arx and arx2 (all_reduce, all_gather; every point must be ok, i.e. its result exact) writes
DIR/world3-NAME; the communicator then routes through arx and arx2 by a fixed table and by the
sweep's own calibrated thresholds, each result checked exact. --unreachable DEVS: arx pinned to
devices that leave some pair of ranks without a link fails on every rank, at connect, naming the
ranks. Prints `WORLD3 PASS` on rank 0; exits 1 on any failure.
"""

from __future__ import annotations

import time

START = time.monotonic()

import argparse
import dataclasses
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from arxtune.harness import sweep
from arxtune.harness.calibrate import calibrate
from arxtune.harness.config import from_mapping
from arxtune.harness.results import load_run
from arxtune.harness import distributed
from arxtune.runtime.communicator import Communicator
from arxtune.runtime.ops import expected_output, make_input, mismatch
from arxtune.runtime.rdma import RdmaConfig, connect, gloo_exchange, reach
from arxtune.runtime.rdma.connection import share_facts
from arxtune.runtime.thresholds import BackendSetup, Range, Table, Thresholds

MAX_BYTES = 1 << 20
STRIPE_MIN = 32 << 10
failures: list[str] = []


def expect(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)
        print(f"[rank {dist.get_rank()}] FAIL {what}", file=sys.stderr, flush=True)


def say(text: str) -> None:
    if dist.get_rank() == 0:
        print(f"[{time.monotonic() - START:.0f} s] {text}", flush=True)


def check_unreachable(ctx, devices: list[str]) -> None:
    """A pair without a link is one error on every rank, raised at connect, naming the ranks; no hang."""
    exchange = gloo_exchange(ctx.cpu_group, ctx.world_size)
    t0 = time.monotonic()
    try:
        connect(RdmaConfig.resolve({"devices": devices}), ctx.rank, ctx.world_size, exchange).close()
        message = ""
    except reach.Unreachable as exc:
        message = str(exc)
    took = time.monotonic() - t0
    everyone = distributed.gather_objects(message, ctx.cpu_group)
    expect(bool(message) and len(set(everyone)) == 1, f"arx on {devices}: every rank raises the same Unreachable ({everyone})")
    expect("rank 0 and rank 1" in message and "/24" in message, f"the error names the ranks and their subnets: {message}")
    expect(took < 60, f"the error came after {took:.0f} s")
    say(f"UNREACHABLE arx on {','.join(devices)}, {took:.1f} s on rank 0: {message}")


def show_reach(ctx, name: str, devices: list[str] | None) -> None:
    group = share_facts(RdmaConfig.resolve({"devices": devices} if devices else {}), ctx.rank, gloo_exchange(ctx.cpu_group, ctx.world_size))
    say(f"REACH {name} ({', '.join(devices) if devices else 'every device'}):\n{reach.render(group)}")


def exact_calls(comm: Communicator, ctx, label: str) -> None:
    """Every op at sizes across the table's boundaries; results against exact references."""
    for op, n in (("all_reduce", 1000), ("all_reduce", 20_000), ("all_gather", 3000), ("all_gather", 20_000)):
        for salt in range(2):
            x = make_input(op, n, ctx.rank, ctx.world_size, torch.float32, ctx.device, salt)
            y = getattr(comm, op)(x.view(-1, 1) if op == "all_gather" else x)
            bad = mismatch(y.view(-1), expected_output(op, n, ctx.rank, ctx.world_size, torch.float32, salt))
            expect(bad is None, f"{label}: communicator {op} n={n}: {bad}")


def run_topology(ctx, name: str, devices: list[str], out: Path) -> None:
    show_reach(ctx, name, devices)
    # one size, 64 KiB, striped where a peer has two links (the switch's twins; the communicator's calls cover
    # smaller ones); few samples: an emulated guest takes tens of milliseconds a call, and what counts here is
    # that every point runs and checks exact
    options = {"devices": devices, "max_bytes": MAX_BYTES, "stripe_min_bytes": STRIPE_MIN, "timeout_s": 120}
    config = from_mapping(
        {
            "backends": ["gloo", "arx", "arx2"],
            "ops": ["all_reduce", "all_gather"],
            "dtypes": ["float32"],
            "views": ["eager"],
            "min_bytes": 65536,
            "max_bytes": 65536,
            "point_budget_s": 0.01,
            "timeout_s": 300,
            "warmup_iters": 1,
            "rounds": 2,
            "max_extra_rounds": 0,
            "min_iters": 2,
            "out": str(out),
            "backend_options": {"arx": options, "arx2": options},
        }
    )
    t0 = time.monotonic()
    path = sweep._run(config, dataclasses.replace(ctx, options=config.backend_options), f"world3-{name}", None, False)
    say(f"SWEEP {name}: {path} in {time.monotonic() - t0:.0f} s")
    verdict = ""
    if ctx.rank == 0:
        run = load_run(path)
        for backend in ("arx", "arx2"):
            state = run.meta.backends[backend]
            if not state["available"]:
                verdict += f"{backend} could not run: {state}; "
            bad = [(p.op, p.size, p.status, p.error) for p in run.records if p.backend == backend and p.status != "ok"]
            verdict += f"{backend} points not ok: {bad}; " if bad else ""
        if not [p for p in run.records if p.backend == "arx"]:
            verdict += "no arx point was measured; "
        calibrate(run).save(Path(path) / "thresholds.json")
    verdict = distributed.gather_objects(verdict, ctx.cpu_group)[0]
    expect(not verdict, f"{name} sweep: {verdict}")

    setup = {
        b: BackendSetup(
            options={"devices": devices, "max_bytes": MAX_BYTES, "stripe_min_bytes": STRIPE_MIN}, capacity={"all_reduce": MAX_BYTES}
        )
        for b in ("arx", "arx2")
    }
    table = Thresholds(
        "gloo",
        0.05,
        {"run_id": f"world3-{name}"},
        (
            Table("all_reduce", "float32", ctx.world_size, (Range(0, 32768, "arx"), Range(32768, None, "arx2"))),
            Table("all_gather", "float32", ctx.world_size, (Range(0, None, "arx"),)),
        ),
        backend_setup=setup,
    )
    fixed = Communicator(ctx, table)
    exact_calls(fixed, ctx, f"{name} fixed table")
    calls = dict(fixed.calls)
    expect(
        all(calls.get(key, 0) > 0 for key in (("all_reduce", "arx"), ("all_reduce", "arx2"), ("all_gather", "arx"))),
        f"{name}: the fixed table's calls went through arx and arx2: {calls}",
    )
    say(f"COMMUNICATOR {name} fixed table: {fixed.summary()}; calls {calls}")
    fixed.close()
    measured = Communicator(ctx, Path(path) / "thresholds.json")
    exact_calls(measured, ctx, f"{name} calibrated")
    expect(measured.thresholds is not None, f"{name}: the calibrated file serves this world-3 group")
    say(f"COMMUNICATOR {name} calibrated: {measured.summary()}; calls {dict(measured.calls)}")
    measured.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--topology", action="append", default=[], help="NAME=DEV,DEV (repeatable)")
    ap.add_argument("--unreachable", help="DEV,DEV: arx pinned to these must fail at connect")
    args = ap.parse_args()
    ctx = distributed.init(600.0)
    say(f"WORLD3 joined, rank 0 on {socket.gethostname()}")
    try:
        if ctx.world_size != 3:
            expect(False, f"world size {ctx.world_size}, not 3")
        show_reach(ctx, "all", None)
        if args.unreachable:
            check_unreachable(ctx, args.unreachable.split(","))
        for spec in args.topology:
            name, _, devices = spec.partition("=")
            run_topology(ctx, name, devices.split(","), args.out)
        count = torch.tensor(len(failures))
        dist.all_reduce(count)
        say(f"WORLD3 {'PASS' if int(count) == 0 else f'FAIL ({int(count)} failures)'} world={ctx.world_size}")
        return 0 if int(count) == 0 else 1
    finally:
        distributed.shutdown(together=not failures)


if __name__ == "__main__":
    sys.exit(main())
