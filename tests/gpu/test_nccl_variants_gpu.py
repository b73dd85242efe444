"""GPU tier: NCCL variants and the tuner plugin with the real NCCL (skips without a GPU).

On one rank NCCL never consults NCCL_PROTO / NCCL_ALGO: its tuning model
returns before reading them (src/graph/tuning.cc, `if (nRanks <= 1) return`,
NCCL 2.21 to 2.29) and its collectives are plain copies. So on one GPU these
prove plumbing, not NCCL's obedience: each variant runs, is checked and
recorded; its protocol and algorithm are in the environment while NCCL creates
that communicator and no other (seen from inside NCCL by arxtune's tuner
plugin, whose init NCCL calls one step before its tuning model); its channel
count is NCCL's own "N coll channels" line. With two GPUs the two-rank test
shows NCCL itself taking each setting ("NCCL_PROTO set by environment", and
per call "Algo RING proto LL"). Speed: scripts/nccl-variants-2gpu.sh.

    PYTHONPATH=$PWD python3 -m pytest -q -s -rs tests/gpu/test_nccl_variants_gpu.py
"""

from __future__ import annotations

import os
import re
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
    config.write_text(
        '[sweep]\nbackends = ["nccl"]\nops = ["all_reduce", "all_gather"]\ndtypes = ["bfloat16"]\n'
        'modes = ["eager", "graph"]\nmin_bytes = "4KiB"\nmax_bytes = "1MiB"\nstep_factor = 16\npoint_budget_s = 0.05\n'
        '[sweep.backend_options.nccl]\nvariants = ["proto=LL", "channels=2,proto=simple"]\n'
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "arxtune",
            "sweep",
            "-c",
            str(config),
            "--nproc-per-node",
            "1",
            "--out",
            str(tmp_path),
            "--run-id",
            "variants",
            "--no-progress",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    exported = subprocess.run(
        [sys.executable, "-m", "arxtune", "calibrate", str(tmp_path / "variants"), "--baseline", "nccl", "--export", "nccl-tuner"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert (tmp_path / "variants" / "nccl-tuner.csv").exists()


CREATE = """
import ctypes, os, sys, torch, torch.distributed as dist
from arxtune.runtime.backends import GroupContext, create

libc = ctypes.CDLL(None)


def mark(text):
    libc.fflush(None)  # NCCL logs through C's buffered stdout: flush it so its lines stay in their communicator's section
    print(text, flush=True)


rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
torch.cuda.set_device(rank)
for name in sys.argv[4:]:
    mark("== create " + name)
    backend = create(name, GroupContext(rank, world, rank, torch.device("cuda", rank), dist.group.WORLD))
    out = torch.zeros(16384, device="cuda")  # a 64 KiB float32 all-reduce
    backend.all_reduce(torch.ones(16384, device="cuda"), out)
    torch.cuda.synchronize()
    assert out.eq(world).all()
    mark("== created %s; after it NCCL_PROTO=%s NCCL_ALGO=%s" % (name, os.environ.get("NCCL_PROTO"), os.environ.get("NCCL_ALGO")))
    backend.close()
mark("== done")
dist.destroy_process_group()
"""


def _create(tmp_path, names: list[str], world: int = 1, **env) -> list[str]:
    """Run CREATE on `world` ranks (one GPU each), creating `names` in order; each rank's output."""
    store = tmp_path / f"store-{os.urandom(4).hex()}"  # torch's file store: a fresh file per group
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CREATE, str(rank), str(world), str(store), *names],
            env=_env(NCCL_DEBUG="INFO", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    said = []
    for proc in procs:
        try:
            said.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for proc, text in zip(procs, said):
        assert proc.returncode == 0 and "== done" in text, text
    return said


def _sections(said: str) -> dict[str, str]:
    """One rank's output split by communicator: name -> what was printed while it was created and used."""
    return {chunk.partition("\n")[0]: chunk.partition("\n")[2] for chunk in said.split("== create ")[1:]}


def _coll_channels(section: str) -> int:
    found = re.findall(r"NCCL INFO (\d+) coll channels", section)
    assert len(found) == 1, section
    return int(found[0])


def _tuner_plugin(tmp_path, text: str = "") -> dict[str, str]:
    if torch.cuda.nccl.version() < (2, 22, 0):
        pytest.skip(f"NCCL {torch.cuda.nccl.version()} predates the tuner interfaces arxtune's plugin exports (2.22, v3)")
    from arxtune.runtime import nccl_tuner

    policy = tmp_path / "policy.csv"
    policy.write_text(text)
    return {nccl_tuner.PLUGIN_ENV: str(nccl_tuner.build()), nccl_tuner.CONFIG_ENV: str(policy)}


def test_a_variants_settings_reach_its_communicator_alone_at_one_rank(tmp_path):
    names = ["nccl[proto=LL,algo=Ring]", "nccl", "nccl[channels=3]", "nccl[channels=5]"]
    said = _create(tmp_path, names, NCCL_DEBUG_SUBSYS="INIT,ENV,TUNING", **_tuner_plugin(tmp_path))[0]  # type: ignore[arg-type]
    print(said)
    part = _sections(said)
    assert list(part) == names, said
    # seen from inside NCCL: the plugin's init runs in ncclCommInitRank, just before NCCL's tuning model
    assert "arxtune tuner: communicator of 1 ranks created with NCCL_PROTO=LL NCCL_ALGO=Ring" in part[names[0]], said
    assert "after it NCCL_PROTO=None NCCL_ALGO=None" in part[names[0]]
    for name in names[1:]:  # the plugin's init ran for each later communicator, and none was made under them
        assert "arxtune tuner: 0 rules from" in part[name] and "created with" not in part[name], (name, said)
    # the channel count goes through ncclConfig_t (minCTAs = maxCTAs); NCCL says how many it set up
    own = _coll_channels(part["nccl"])
    assert [_coll_channels(part[name]) for name in names[2:]] == [3, 5], said
    print(f"one rank: NCCL's own choice {own} channels; nccl[channels=3] 3, nccl[channels=5] 5")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL takes a protocol or algorithm only with two ranks or more: needs 2 GPUs")
def test_nccl_itself_takes_each_variants_settings_at_two_ranks(tmp_path):
    names = ["nccl[proto=LL,algo=Ring]", "nccl", "nccl[channels=2]"]
    said = _create(tmp_path, names, world=2, NCCL_DEBUG_SUBSYS="INIT,ENV,TUNING")
    print(said[0])
    for text in said:
        part = _sections(text)
        assert list(part) == names, text
        assert "NCCL_PROTO set by environment to LL" in part[names[0]], text
        assert "NCCL_ALGO set by environment to Ring" in part[names[0]], text
        assert "NCCL_PROTO set by environment" not in part["nccl"] and "NCCL_ALGO set by environment" not in part["nccl"]
        assert _coll_channels(part["nccl[channels=2]"]) == 2, text
    if torch.cuda.nccl.version() >= (2, 25, 0):  # rank 0 logs each call's choice as "AllReduce: N Bytes -> Algo A proto P"
        part = _sections(said[0])
        assert "AllReduce: 65536 Bytes -> Algo RING proto LL " in part[names[0]], said[0]
        calls = re.findall(r"AllReduce: 65536 Bytes .* channel\{Lo..Hi\}=\{\d+..(\d+)\}", part["nccl[channels=2]"])
        his = [int(hi) for hi in calls]
        assert his and max(his) <= 1, part["nccl[channels=2]"]


def test_nccl_loads_the_tuner_plugin_and_reads_its_file(tmp_path):
    plugin = _tuner_plugin(tmp_path, "allreduce,0,65535,ring,ll,4,-1,-1,-1,-1\nallreduce,65536,-1,ring,simple,-1,-1,-1,-1,-1\n")
    said = _create(tmp_path, ["nccl"], NCCL_DEBUG_SUBSYS="INIT,TUNING", **plugin)[0]  # type: ignore[arg-type]
    assert "arxtune tuner: 2 rules from" in said, said
