"""GPU tier: CUDA timing and GPU backends. Skips cleanly without a GPU (CI has none).

make test-gpu
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arxtune.runtime import timing
from arxtune.harness.results import load_run
from arxtune.runtime.timing import CudaBackToBackTimer, CudaGraphTimer, CudaIsolatedTimer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _sleep_op(cycles: int):
    return lambda: torch.cuda._sleep(cycles)


def _cycles_per_us() -> float:
    """Calibrate torch.cuda._sleep against events on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / (start.elapsed_time(end) * 1e3)


def test_all_three_views_agree_on_a_known_kernel():
    cycles = int(_cycles_per_us() * 200)  # a ~200 us kernel: launch costs vanish beside it
    op = _sleep_op(cycles)
    medians = {}
    for timer in (CudaIsolatedTimer(), CudaBackToBackTimer(ops_per_sample=5), CudaGraphTimer(ops_per_sample=5)):
        timer.prepare(op)
        medians[timer.view] = sorted(timer.time_once(op) for _ in range(21))[10]
    assert 150 < medians["isolated"] < 300, medians
    assert medians["eager"] == pytest.approx(medians["isolated"], rel=0.15)
    assert medians["graph"] == pytest.approx(medians["isolated"], rel=0.15)


def test_back_to_back_and_graphs_hide_the_launch_cost_of_tiny_ops():
    x = torch.zeros(16, device="cuda")
    op = lambda: x.add_(1)  # noqa: E731
    medians = {}
    for timer in (CudaIsolatedTimer(), CudaBackToBackTimer(), CudaGraphTimer()):
        timer.prepare(op)  # type: ignore[arg-type]
        medians[timer.view] = sorted(timer.time_once(op) for _ in range(51))[25]  # type: ignore[arg-type]
    assert medians["graph"] < medians["eager"] < medians["isolated"], medians


def test_a_process_replays_its_first_graphs_before_it_times_one(monkeypatch):
    monkeypatch.setattr(timing, "_graphs_made", 0)
    x = torch.zeros(16, device="cuda")
    op = lambda: x.add_(1)  # noqa: E731
    CudaGraphTimer(ops_per_sample=3).prepare(op)  # type: ignore[arg-type]  # a warm-up call, then SETTLE_GRAPHS graphs of 3 calls replayed once
    assert x[0].item() == 1 + timing.SETTLE_GRAPHS * 3
    CudaGraphTimer(ops_per_sample=3).prepare(op)  # type: ignore[arg-type]  # settled: the warm-up call alone (capture runs nothing)
    assert x[0].item() == 2 + timing.SETTLE_GRAPHS * 3


def test_gpu_sweep_with_nccl_symmetric_memory_and_graphs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "arxtune",
            "sweep",
            "--backends",
            "nccl,torch_nccl,symm_mem,symm_mem2,arx,gloo",
            "--views",
            "eager,isolated,graph,decode",
            "--dtypes",
            "bfloat16,float32",
            "--min-bytes",
            "4KiB",
            "--max-bytes",
            "4MiB",
            "--step-factor",
            "16",
            "--point-budget-s",
            "0.05",
            "--out",
            str(tmp_path),
            "--run-id",
            "gpu",
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(tmp_path / "gpu")
    assert run.meta.world_size == GPUS and run.meta.device_type == "cuda" and run.meta.nccl_version
    frame = run.frame()
    for name in ("nccl", "torch_nccl"):  # NCCL called directly, and through torch.distributed
        rows = frame[frame.backend == name]
        assert set(rows.status) == {"ok"} and set(rows["view"]) == {"eager", "isolated", "graph", "decode"}, rows[["status", "error"]]
        assert set(rows.op) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert not run.meta.backends["gloo"]["available"]  # gloo times CPU tensors, not CUDA ones
    for name in ("symm_mem", "symm_mem2"):
        state = run.meta.backends[name]
        if state["available"]:
            rows = frame[(frame.backend == name) & (frame.op == "all_reduce")]
            assert set(rows.status) == {"ok"}, rows[["status", "error"]]
        else:
            assert state["reason"]
    assert (Path(tmp_path) / "gpu" / "plot.png").exists()


@pytest.fixture
def nccl_alone():
    """arxtune's nccl backend at world size 1 on GPU 0."""
    import torch.distributed as dist

    from arxtune.runtime.backends import GroupContext, create

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        backend = create("nccl", GroupContext(0, 1, 0, torch.device("cuda", 0), dist.group.WORLD))
        yield backend
        backend.close()
    finally:
        dist.destroy_process_group()


def test_nccl_called_directly_is_exact_eagerly_and_in_a_graph_as_the_communicator_calls_it(nccl_alone):
    """The backend's own op methods (what the router calls), at world size 1, out of place."""
    from arxtune.runtime.ops import OP_SPECS, expected_output, make_input, mismatch

    backend, dev = nccl_alone, torch.device("cuda", 0)
    for op in OP_SPECS:
        inp = make_input(op, 4096, 0, 1, torch.bfloat16, dev)
        out = torch.full((OP_SPECS[op].shapes(4096, 1)[1],), -1.0, dtype=torch.bfloat16, device=dev)
        getattr(backend, op)(inp, out)
        torch.cuda.synchronize()
        assert mismatch(out, expected_output(op, 4096, 0, 1, torch.bfloat16)) is None, op
        assert inp.data_ptr() != out.data_ptr()
    inp = make_input("all_reduce", 4096, 0, 1, torch.bfloat16, dev)
    graph_out = torch.zeros_like(inp)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.all_reduce(inp, graph_out)
    graph.replay()
    torch.cuda.synchronize()
    assert mismatch(graph_out, expected_output("all_reduce", 4096, 0, 1, torch.bfloat16)) is None


def test_nccl_eager_samples_record_their_events_from_the_c_loop_around_their_launches(nccl_alone):
    """At 16 MiB a call is bound by the GPU, so the eager view (events from C) must agree with the graph view."""
    from arxtune.runtime.ops import expected_output, make_input, mismatch

    assert nccl_alone.effective_options() == {"eager_loop": "c", "eager_events": "c"}
    dev, count = torch.device("cuda", 0), 8 << 20
    ins = [make_input("all_reduce", count, 0, 1, torch.bfloat16, dev) for _ in range(2)]
    outs = [torch.zeros_like(t) for t in ins]
    rotation = nccl_alone.bind_rotation("all_reduce", ins, outs)
    medians = {}
    for timer in (CudaBackToBackTimer(ops_per_sample=5), CudaGraphTimer(ops_per_sample=5)):  # new events: created on first use
        timer.prepare(rotation)
        medians[timer.view] = sorted(timer.time_once(rotation) for _ in range(21))[10]
    assert 5 < medians["graph"] and medians["eager"] == pytest.approx(medians["graph"], rel=0.15), medians
    torch.cuda.synchronize()
    for out in outs:
        assert mismatch(out, expected_output("all_reduce", count, 0, 1, torch.bfloat16)) is None


def test_the_busy_kernel_lasts_what_it_is_asked_and_the_decode_view_subtracts_it():
    """The decode view's busy kernel (PTX loaded through the driver) spins for its time on the GPU's clock;
    behind it, a ~20 us kernel reads about 20 us per call, whether the timer loops or the op does."""
    from arxtune.runtime.cudadrv import BusyKernel
    from arxtune.runtime.timing import CudaDecodeTimer

    busy = BusyKernel(100.0, 0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    busy.repeat(10, start, end)
    end.synchronize()
    assert 95 < start.elapsed_time(end) * 1e3 / 10 < 120
    cycles = int(_cycles_per_us() * 20)
    op = _sleep_op(cycles)
    alone = CudaBackToBackTimer(ops_per_sample=10)
    alone_us = sorted(alone.time_once(op) for _ in range(11))[5]
    timer = CudaDecodeTimer(busy_us=50.0, ops_per_sample=10)
    timer.prepare(op)
    decode_us = sorted(timer.time_once(op) for _ in range(11))[5]
    assert decode_us == pytest.approx(alone_us, abs=3.0), (decode_us, alone_us)


def test_nccl_decode_samples_put_the_busy_kernel_before_each_call_from_the_c_loop(nccl_alone):
    from arxtune.runtime.ops import expected_output, make_input, mismatch
    from arxtune.runtime.timing import CudaDecodeTimer

    dev, count = torch.device("cuda", 0), 8 << 20
    ins = [make_input("all_reduce", count, 0, 1, torch.bfloat16, dev) for _ in range(2)]
    outs = [torch.zeros_like(t) for t in ins]
    rotation = nccl_alone.bind_rotation("all_reduce", ins, outs)
    assert rotation.decode is not None
    eager = CudaBackToBackTimer(ops_per_sample=5)
    eager_us = sorted(eager.time_once(rotation) for _ in range(11))[5]
    timer = CudaDecodeTimer(busy_us=200.0, ops_per_sample=5)
    timer.prepare(rotation)
    decode_us = sorted(timer.time_once(rotation) for _ in range(11))[5]
    # 16 MiB is bound by the GPU either way: the busy kernel's time is taken out (not hundreds of us) and the call
    # is not hidden under it (not near zero). It may read below eager (an H100: 10.0 against 13.6 us), the GPU
    # kept busy between calls.
    assert 0.5 * eager_us <= decode_us <= 1.2 * eager_us, (decode_us, eager_us)
    torch.cuda.synchronize()
    for out in outs:
        assert mismatch(out, expected_output("all_reduce", count, 0, 1, torch.bfloat16)) is None
