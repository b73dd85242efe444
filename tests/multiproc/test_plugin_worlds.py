"""The vLLM plugin's start-up at several TP sizes: one file merged from TP=2, 3 and 4 runs serves each;
a file for TP=2 only, served at TP=4, is one warning and vLLM as it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arxtune.harness.calibrate import calibrate

from helpers.workers import torchrun
from helpers.runs import make_run

TESTS = Path(__file__).parents[1]
KiB = 1024
SIZES = [1 << k for k in range(10, 20)]


def _crossover(at):
    """'counting' wins all_reduce below about `at` bytes, gloo (the file's baseline: vLLM's path) above."""
    return lambda b, n: 5 + n / 1000 if b == "counting" else 5 + at / 1000


@pytest.mark.multiproc
def test_a_merged_file_serves_tp2_tp3_and_tp4_and_a_tp2_file_at_tp4_is_one_warning(tmp_path):
    runs = [
        make_run(tmp_path, _crossover(at), SIZES, backends=("gloo", "counting"), world=world, run_id=f"w{world}")
        for world, at in ((2, 4 * KiB), (3, 16 * KiB), (4, 64 * KiB))
    ]
    merged = calibrate(runs).save(tmp_path / "merged.json")
    tp2 = calibrate(runs[0]).save(tmp_path / "tp2.json")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ARXTUNE_OVERRIDES", "ARXTUNE_FINGERPRINT")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        ARXTUNE_EXTRA_BACKENDS="counting=helpers.backends:CountingGloo",
        ARXTUNE_BOOT="off",
        OMP_NUM_THREADS="1",
    )
    result = torchrun("plugin_worker.py", 4, merged, tp2, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("plugin ok") == 4, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("arxtune: tp:")]
    for world in (2, 3, 4):
        assert len([x for x in lines if x.startswith(f"arxtune: tp:merged{world} (world {world}): tables eager 1")]) == 1, lines
    warnings = [x for x in lines if x.startswith("arxtune: tp:tp2only")]
    assert warnings == [
        f"arxtune: tp:tp2only (world 4): {tp2} holds tables for world sizes [2], not 4; every call uses vLLM's CpuCommunicator"
    ]
