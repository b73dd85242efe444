"""arxg's proxies over real verbs (soft-RoCE), the GPU side stood in by CPU ranks.

Each rank's proxy process (its C step loop, and once its Python one) registers the rank's shared segment with the NIC and
posts the payload + flag writes; the stand-in ranks (threads here) write
doorbells and read flags exactly as the GPU kernels do."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from arxtune.runtime import env
from arxtune.runtime.ops import OP_SPECS, expected_output, make_input, mismatch
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaTimeout
from arxtune.runtime.rdma.graph import session as session_mod
from arxtune.runtime.rdma.graph.session import open_local
from helpers.arxg_cpu_rank import CpuRank

pytestmark = [pytest.mark.rdma, pytest.mark.timeout(1500)]


@pytest.fixture(autouse=True)
def _slow_proxy_start(monkeypatch):
    """Under software emulation a proxy needs minutes to import torch and pyverbs, more with 3 starting at once."""
    monkeypatch.setattr(session_mod, "SETUP_TIMEOUT_S", 900.0)


def _loop(monkeypatch, loop: str) -> None:
    """Which step loop the proxies started from here run: the C one ("native") or Python's (the fallback)."""
    monkeypatch.setenv(env.ARXG_NATIVE.name, "1" if loop == "native" else "0")


@pytest.mark.parametrize("world, loop", [(2, "native"), (3, "native"), (2, "python")])
def test_standin_ranks_through_verbs_proxies_are_exact(world, loop, monkeypatch):
    _loop(monkeypatch, loop)
    sessions = open_local(RdmaConfig.resolve({"max_bytes": 64 << 10, "timeout_s": 60}), world, "verbs")
    try:
        assert all(s.transport == "verbs" for s in sessions)
        assert [s.proxy.loop for s in sessions] == [loop] * world  # no silent fallback to the Python loop
        ranks = [CpuRank(s) for s in sessions]
        cases = [(op, dtype, n) for op in OP_SPECS for dtype in (torch.bfloat16, torch.int32) for n in (1, 4096)]

        def work(r):
            got = []
            for salt in range(2):
                for op, dtype, n in cases:
                    out = torch.empty(OP_SPECS[op].shapes(n, world)[1], dtype=dtype)
                    ranks[r].run(op, make_input(op, n, r, world, dtype, torch.device("cpu"), salt), out)
                    got.append((op, dtype, n, salt, out))
            return got

        with ThreadPoolExecutor(world) as pool:
            per_rank = list(pool.map(work, range(world)))
        for r, got in enumerate(per_rank):
            for op, dtype, n, salt, out in got:
                assert mismatch(out, expected_output(op, n, r, world, dtype, salt)) is None, (r, op, dtype, n, salt)
    finally:
        for s in sessions:
            s.close()


def test_a_peer_whose_native_proxy_died_is_named_within_the_timeout(monkeypatch):
    _loop(monkeypatch, "native")
    sessions = open_local(RdmaConfig.resolve({"max_bytes": 4096, "timeout_s": 5}), 2, "verbs")
    try:
        assert [s.proxy.loop for s in sessions] == ["native", "native"]
        sessions[1].proxy.proc.kill()
        x = torch.ones(8)
        with pytest.raises(RdmaTimeout, match="rank 1 sent nothing"):
            CpuRank(sessions[0]).all_reduce(x, torch.empty_like(x))
    finally:
        for s in sessions:
            s.close()
