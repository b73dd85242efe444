"""arxg on a GPU (make test-gpu): two ranks over the shared-memory fabric on one GPU.

Two pairings: two GPU ranks in this process on two streams (each with its own
segment and proxy), and a GPU rank with a CPU stand-in rank in another process.
Graphs are captured once and replayed with new inputs each replay; eager calls
run back to back without a sync between them; every result is checked bit for
bit and across ranks. Every memory mode runs where the device allows it (test
ids name it: `-k registered_memory`, `-k direct_memory`); a mode the device refuses is
skipped with the device's reason. Skips without a GPU (CI has none).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from arxtune.runtime.ops import OP_SPECS, expected_output, make_input
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaTimeout, RdmaUnavailable

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "helpers" / "arxg_standin.py"
SALTS = 7


#: test ids name the mode as `<mode>_memory`: `-k direct_memory` runs the direct mode's tests alone
MEMORY = [pytest.param(m, id=f"{m}_memory") for m in ("registered", "direct")]


def _allowed(memory: str) -> str:
    """`memory` where this device allows it; otherwise the test skips with the device's reason."""
    from arxtune.runtime.rdma.graph.memory import choose, read_attributes

    attrs = read_attributes(0)
    try:
        return str(choose(attrs, memory))
    except RdmaUnavailable as exc:
        pytest.skip(f"{exc} (device attributes: {attrs.describe()})")


def _pair(world: int, timeout_s: float = 20.0, memory: str = "auto", launch: str = "native"):
    from helpers.arxg_cpu_rank import RanksOnOneGpu

    return RanksOnOneGpu(world, RdmaConfig(max_bytes=1 << 20, timeout_s=timeout_s), memory=memory, launch=launch)


def _capture(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


@pytest.mark.parametrize("memory", MEMORY)
@pytest.mark.parametrize(
    "op,dtype,n,replays,chain",
    [
        ("all_reduce", torch.bfloat16, 8192, 10_000, 1),  # 16 KiB
        ("all_reduce", torch.bfloat16, 8192, 1000, 10),  # a rank runs ahead of its peer through both slots
        ("all_reduce", torch.float32, 250_000, 200, 1),  # many programs per kernel, 1 MB
        ("all_gather", torch.int32, 1000, 1000, 1),
        ("reduce_scatter", torch.float16, 4096, 1000, 3),
    ],
)
def test_two_gpu_ranks_replay_a_captured_graph_with_new_inputs_exactly(op, dtype, n, replays, chain, memory):
    """Each replay runs a chain of `chain` calls per rank on the same buffers: the last call's output is checked."""
    print(f"arxg memory: {_allowed(memory)}")
    world, dev = 2, torch.device("cuda", 0)
    pair = _pair(world, memory=memory)
    try:
        inputs = [[make_input(op, n, r, world, dtype, dev, s) for s in range(SALTS)] for r in range(world)]
        refs = [[expected_output(op, n, r, world, dtype, s).to(dev) for s in range(SALTS)] for r in range(world)]
        ins = [torch.empty_like(inputs[r][0]) for r in range(world)]
        outs = [torch.empty(OP_SPECS[op].shapes(n, world)[1], dtype=dtype, device=dev) for _ in range(world)]
        for r in range(world):
            ins[r].copy_(inputs[r][0])
        g = _capture(lambda: pair.collective(op, ins, outs, chain))
        for i in range(replays):
            s = i % SALTS
            for r in range(world):
                ins[r].copy_(inputs[r][s])
                outs[r].fill_(-1)
            g.replay()
            ok = all(torch.equal(outs[r], refs[r][s]) for r in range(world))
            if op == "all_reduce":
                ok = ok and torch.equal(outs[0], outs[1])
            if not ok:
                pair.check()
                pytest.fail(f"replay {i}: wrong result ({op}, {dtype})")
        pair.check()
    finally:
        pair.close()


@pytest.mark.parametrize(
    "memory,launch",
    [
        pytest.param(m, launch, id=f"{m}_memory-{launch}")
        for m, launch in (("registered", "native"), ("direct", "native"), ("registered", "triton"))
    ],
)
@pytest.mark.parametrize(
    "op,dtype,n",
    [
        ("all_reduce", torch.bfloat16, 8192),  # 16 KiB
        ("all_reduce", torch.float32, 250_000),  # many programs per kernel
        ("all_gather", torch.int32, 1000),
        ("reduce_scatter", torch.float16, 4096),
    ],
)
def test_two_gpu_ranks_run_eager_calls_back_to_back_exactly(op, dtype, n, memory, launch):
    """Batches of SALTS eager calls per rank with no sync between them, each call on its own buffers with its
    own inputs (as a model's layers call), checked after each batch; both launch paths."""
    print(f"arxg memory: {_allowed(memory)}, launch {launch}")
    world, dev, batches = 2, torch.device("cuda", 0), 300
    pair = _pair(world, memory=memory, launch=launch)
    try:
        ins = [[make_input(op, n, r, world, dtype, dev, s) for s in range(SALTS)] for r in range(world)]
        refs = [[expected_output(op, n, r, world, dtype, s).to(dev) for s in range(SALTS)] for r in range(world)]
        outs = [[torch.empty(OP_SPECS[op].shapes(n, world)[1], dtype=dtype, device=dev) for _ in range(SALTS)] for _ in range(world)]
        for b in range(batches):
            for r in range(world):
                for o in outs[r]:
                    o.fill_(-1)
            for s in range(SALTS):
                pair.collective(op, [ins[r][s] for r in range(world)], [outs[r][s] for r in range(world)])
            torch.cuda.synchronize()
            bad = [(r, s) for r in range(world) for s in range(SALTS) if not torch.equal(outs[r][s], refs[r][s])]
            if bad:
                pair.check()
                pytest.fail(f"batch {b}: wrong result at (rank, call) {bad[:4]} ({op}, {dtype}, {memory}, {launch})")
        pair.check()
    finally:
        pair.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("memory", MEMORY)
def test_gpu_rank_with_a_cpu_standin_then_the_standin_is_killed(memory):
    from arxtune.runtime.rdma.graph.gpu import GpuRank
    from arxtune.runtime.rdma.graph.session import open_session, store_exchange

    print(f"arxg memory: {_allowed(memory)}")
    op, dtype, n, calls, world, dev = "all_reduce", torch.bfloat16, 8192, 2000, 2, torch.device("cuda", 0)
    port = _free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, world, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    peer = subprocess.Popen(
        [sys.executable, str(STANDIN), str(port), "1", str(world), op, "bfloat16", str(n), str(calls + 1000), str(SALTS), "3"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    gpu = None
    try:
        gpu = GpuRank(
            open_session(RdmaConfig(max_bytes=1 << 20, timeout_s=3.0), 0, world, store_exchange(store, 0, world), "shm"), dev, memory=memory
        )
        inputs = [make_input(op, n, 0, world, dtype, dev, s) for s in range(SALTS)]
        refs = [expected_output(op, n, 0, world, dtype, s).to(dev) for s in range(SALTS)]
        inp, out = inputs[0].clone(), torch.empty_like(inputs[0])
        gpu.all_reduce(inp, out)  # eager call: compiles, and is step 0 of the stand-in's salt 0
        torch.cuda.synchronize()
        assert torch.equal(out, refs[0])
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gpu.all_reduce(inp, out)
        for i in range(1, calls):
            inp.copy_(inputs[i % SALTS])
            g.replay()
            assert torch.equal(out, refs[i % SALTS]), f"replay {i}"
        gpu.check()
        peer.kill()  # the peer dies in the middle of its calls
        peer.wait(timeout=10)
        start = time.monotonic()
        inp.copy_(inputs[calls % SALTS])
        g.replay()
        g.replay()
        torch.cuda.synchronize()  # returns: the kernels gave up waiting
        assert time.monotonic() - start < 15
        with pytest.raises(RdmaTimeout, match="rank 1 sent nothing") as info:
            gpu.check()
        assert info.value.peer == 1 and info.value.op == "all_reduce"
    finally:
        peer.kill()
        if gpu is not None:
            Path(gpu.s.segment.path[:-1] + "1").unlink(missing_ok=True)  # a killed peer leaves its segment
            gpu.close()


def test_gpu_ranks_run_from_a_build_made_elsewhere_where_triton_cannot_be_imported(tmp_path):
    """The kernels built here into a directory (as on another machine), then two ranks in a process where
    `import triton` fails, with an empty cache: eager calls and a graph replay, exact."""
    from arxtune.runtime.rdma.graph import aot, images

    major, minor = torch.cuda.get_device_capability(0)
    capability, bundle = 10 * major + minor, tmp_path / "bundle"
    store = images.Store(bundle)
    for v in (aot.Variant("handshake"), aot.Variant("collective", "all_reduce", "bfloat16", 2, 1, True)):
        store.put(aot.build_variant(v, capability, images.source_hash()))
    script = """
import sys
sys.modules["triton"] = None  # import triton raises ImportError from here on
import torch
from arxtune.runtime.ops import expected_output, make_input, mismatch
from arxtune.runtime.rdma.config import RdmaConfig
from helpers.arxg_cpu_rank import RanksOnOneGpu
pair = RanksOnOneGpu(2, RdmaConfig(max_bytes=1 << 20, timeout_s=20.0))
dev = torch.device("cuda", 0)
ins = [make_input("all_reduce", 8192, r, 2, torch.bfloat16, dev) for r in range(2)]
outs = [torch.zeros_like(i) for i in ins]
for _ in range(100):
    pair.collective("all_reduce", ins, outs)
g = torch.cuda.CUDAGraph()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    pair.collective("all_reduce", ins, outs)
torch.cuda.synchronize()
with torch.cuda.graph(g):
    pair.collective("all_reduce", ins, outs, 5)
for _ in range(100):
    g.replay()
torch.cuda.synchronize()
pair.check()
ref = expected_output("all_reduce", 8192, 0, 2, torch.bfloat16).to(dev)
assert all(torch.equal(o, ref) for o in outs)
print("builds:", sorted(set(b for r in pair.ranks for b in r.builds.values())))
pair.close()
"""
    env = {
        **os.environ,
        "ARXTUNE_ARXG_KERNELS": str(bundle),
        "XDG_CACHE_HOME": str(tmp_path / "empty-cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"the build in {bundle}, made by Triton" in result.stdout
