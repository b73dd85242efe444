"""A CPU stand-in rank of arxg in its own process, paired with a GPU rank by a test.

    python tests/helpers/arxg_standin.py PORT RANK WORLD OP DTYPE N CALLS SALTS TIMEOUT_S

Runs CALLS collectives with inputs make_input(..., salt=i % SALTS), checks each
result bit for bit, prints "ok CALLS" and exits 0 (1 on a wrong result)."""

from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

import torch

from arxtune.runtime.ops import OP_SPECS, expected_output, make_input, mismatch
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.graph.session import open_session, store_exchange
from helpers.arxg_cpu_rank import CpuRank


def main() -> int:
    port, rank, world, op, dtype, n, calls, salts, timeout_s = sys.argv[1:]
    rank, world, n, calls, salts = int(rank), int(world), int(n), int(calls), int(salts)  # type: ignore[assignment]
    dtype = getattr(torch, dtype)
    store = torch.distributed.TCPStore("127.0.0.1", int(port), world, False, timeout=__import__("datetime").timedelta(seconds=60))  # type: ignore[arg-type]
    session = open_session(
        RdmaConfig(max_bytes=1 << 20, timeout_s=float(timeout_s)),
        rank,  # type: ignore[arg-type]
        world,  # type: ignore[arg-type]
        store_exchange(store, rank, world),  # type: ignore[arg-type]
        "shm",
    )
    standin = CpuRank(session)
    cpu = torch.device("cpu")
    inputs = [make_input(op, n, rank, world, dtype, cpu, s) for s in range(salts)]  # type: ignore[arg-type, call-overload]
    refs = [expected_output(op, n, rank, world, dtype, s) for s in range(salts)]  # type: ignore[arg-type, call-overload]
    out = torch.empty(OP_SPECS[op].shapes(n, world)[1], dtype=dtype)  # type: ignore[arg-type]
    print("ready", flush=True)
    try:
        for i in range(calls):  # type: ignore[call-overload]
            standin.run(op, inputs[i % salts], out)
            bad = mismatch(out, refs[i % salts])
            if bad:
                print(f"call {i}: {bad}", flush=True)
                return 1
        print(f"ok {calls}", flush=True)
        return 0
    finally:
        session.close()


if __name__ == "__main__":
    sys.exit(main())
