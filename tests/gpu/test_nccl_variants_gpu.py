"""GPU tier: NCCL variants and the tuner plugin with the real NCCL, at world size 1 (skips without a GPU).

NCCL's one-rank path runs Ring/Simple whatever it is told, so these prove the
plumbing (each variant's communicator is created with its settings, runs, is
checked and recorded; NCCL loads the plugin and reads its file), not speed.
Speed, and NCCL obeying the plugin per call, need two GPUs: scripts/nccl-variants-2gpu.sh.

    PYTHONPATH=$PWD python3 -m pytest -q tests/gpu/test_nccl_variants_gpu.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arxtune.harness.results import load_run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).parents[2]
VARIANTS = ("nccl[proto=LL]", "nccl[proto=Simple,channels=2]")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **extra)
    return env


def test_a_one_gpu_sweep_runs_checks_and_records_each_variant(tmp_path):
    config = tmp_path / "variants.toml"
    config.write_text('[sweep]\nbackends = ["nccl"]\nops = ["all_reduce", "all_gather"]\ndtypes = ["bfloat16"]\n'
                      'modes = ["eager", "graph"]\nmin_bytes = "4KiB"\nmax_bytes = "1MiB"\nstep_factor = 16\npoint_budget_s = 0.05\n'
                      '[sweep.backend_options.nccl]\nvariants = ["proto=LL", "channels=2,proto=simple"]\n')
    result = subprocess.run([sys.executable, "-m", "arxtune", "sweep", "-c", str(config), "--nproc-per-node", "1", "--out",
                             str(tmp_path), "--run-id", "variants", "--no-progress"], env=_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(tmp_path / "variants")
    assert list(run.meta.backends) == ["nccl", *VARIANTS]
    assert run.meta.backends["nccl[proto=LL]"]["options"]["variant"] == {"proto": "LL"}
    assert run.meta.backends["nccl[proto=Simple,channels=2]"]["options"]["variant"] == {"proto": "Simple", "channels": "2"}
    frame = run.frame()
    for name in ("nccl", *VARIANTS):
        rows = frame[frame.backend == name]
        assert len(rows) == 2 * 2 * 3 and set(rows.status) == {"ok"}, rows[["op", "mode", "size", "status", "error"]]
    assert (tmp_path / "variants" / "thresholds.json").exists()
    exported = subprocess.run([sys.executable, "-m", "arxtune", "calibrate", str(tmp_path / "variants"), "--baseline", "nccl",
                               "--export", "nccl-tuner"], env=_env(), capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert (tmp_path / "variants" / "nccl-tuner.csv").exists()


CREATE = """
import os, sys, torch, torch.distributed as dist
from arxtune.runtime.backends import GroupContext, create
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
backend = create(sys.argv[1], GroupContext(0, 1, 0, torch.device("cuda", 0), dist.group.WORLD))
out = torch.zeros(1024, device="cuda")
backend.all_reduce(torch.ones(1024, device="cuda"), out)
torch.cuda.synchronize()
assert out.eq(1).all()
print("AFTER NCCL_PROTO=%s NCCL_ALGO=%s" % (os.environ.get("NCCL_PROTO"), os.environ.get("NCCL_ALGO")), flush=True)
backend.close()
dist.destroy_process_group()
"""


def _create(name: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", CREATE, name], env=_env(NCCL_DEBUG="INFO", **env), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_a_variants_settings_reach_nccl_at_communicator_creation_and_are_gone_after():
    said = _create("nccl[proto=LL,algo=Ring]", NCCL_DEBUG_SUBSYS="ENV")
    assert "NCCL_PROTO set by environment to LL" in said and "NCCL_ALGO set by environment to Ring" in said, said
    assert "AFTER NCCL_PROTO=None NCCL_ALGO=None" in said
    _create("nccl[channels=2]", NCCL_DEBUG_SUBSYS="INIT")  # ncclCommInitRankConfig with 2 CTAs is accepted


def test_nccl_loads_the_tuner_plugin_and_reads_its_file(tmp_path):
    from arxtune.runtime import nccl_tuner

    policy = tmp_path / "policy.csv"
    policy.write_text("allreduce,0,65535,ring,ll,4,-1,-1,-1,-1\nallreduce,65536,-1,ring,simple,-1,-1,-1,-1,-1\n")
    said = _create("nccl", NCCL_DEBUG_SUBSYS="INIT,TUNING", NCCL_TUNER_PLUGIN=str(nccl_tuner.build()),
                   NCCL_TUNER_CONFIG_FILE=str(policy))
    assert "arxtune tuner: 2 rules from" in said, said
