"""`arxtune sweep` times vLLM's CpuCommunicator as the backend "vllm_cpu", next to gloo."""

from __future__ import annotations

import subprocess
import sys

from arxtune.harness.results import load_run
from arxtune.runtime.thresholds import load
from vllm_tier import vllm_env


def arxtune(*args: str, cwd, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arxtune", *args],
        cwd=cwd,
        env=vllm_env(ARXTUNE_DEVICE="cpu"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def vllm_has_shm_kernels() -> bool:
    """Asked of vLLM in a process of its own, as its CPU workers load their kernels."""
    probe = (
        "import torch; from vllm.platforms import current_platform; current_platform.import_kernels(); "
        "print(hasattr(torch.ops._C, 'init_shm_manager'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=vllm_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1] == "True"


def test_sweep_with_vllm_cpu_then_calibrate_against_it(tmp_path):
    sweep = arxtune(
        "sweep",
        "--backends",
        "gloo,vllm_cpu",
        "--ops",
        "all_reduce,all_gather,reduce_scatter",
        "--views",
        "eager",
        "--dtypes",
        "float32",
        "--min-bytes",
        "1KiB",
        "--max-bytes",
        "64KiB",
        "--step-factor",
        "8",
        "--point-budget-s",
        "0.02",
        "--out",
        str(tmp_path),
        "--run-id",
        "vllm-cpu",
        "--no-progress",
        cwd=tmp_path,
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    run = load_run(tmp_path / "vllm-cpu")
    assert run.meta.backends["vllm_cpu"]["available"], run.meta.backends
    # Where vLLM's kernels for this CPU have the shared-memory ops, the sweep must time them, not vLLM's
    # torch.distributed fallback; vLLM's AVX2 kernels lack them, and vLLM serves TP through gloo there too.
    shm = vllm_has_shm_kernels()
    assert run.meta.backends["vllm_cpu"]["options"] == {"path": "shm" if shm else "torch.distributed", "shm_kernels": shm}, (
        run.meta.backends["vllm_cpu"]
    )
    points = [r for r in run.records if r.backend == "vllm_cpu"]
    assert len(points) == 3 * 3  # ops x sizes 1KiB, 8KiB, 64KiB
    assert {r.status for r in points} == {"ok"}, [(r.op, r.size, r.status, r.error) for r in points if r.status != "ok"]
    assert all(r.samples_us for r in points)

    out = tmp_path / "against-vllm.json"
    calibrate = arxtune("calibrate", str(run.path), "--baseline", "vllm_cpu", "--out", str(out), cwd=tmp_path)
    assert calibrate.returncode == 0, calibrate.stdout + calibrate.stderr
    thresholds = load(out)
    assert thresholds.baseline == "vllm_cpu"
    assert thresholds.backends <= {"gloo", "vllm_cpu"}


def test_vllm_cpu_is_a_registered_backend():
    from arxtune.runtime import backends

    assert backends.REGISTRY.get("vllm_cpu") == "arxtune.runtime.backends.vllm_cpu:VllmCpuBackend", (
        'arxtune/backends/__init__.py REGISTRY needs "vllm_cpu": "arxtune.runtime.backends.vllm_cpu:VllmCpuBackend"'
    )


def test_vllm_cpu_names_its_reason_when_it_cannot_run():
    import torch

    from arxtune.runtime.backends import BackendUnavailable, GroupContext
    from arxtune.runtime.backends.vllm_cpu import VllmCpuBackend

    for ctx, reason in (
        (GroupContext(0, 2, 0, torch.device("cuda", 0), None), "runs on CPU tensors"),
        (GroupContext(0, 2, 0, torch.device("cpu"), None), "torch.distributed is not initialised"),
    ):
        try:
            VllmCpuBackend(ctx)
        except BackendUnavailable as exc:
            assert reason in exc.reason
        else:
            raise AssertionError("expected BackendUnavailable")
