"""`arxtune e2e`: does a thresholds file make vLLM's decode faster, with the same tokens?

Collectives that win in isolation can leave serving at parity, so this runs
vLLM's real engine with tensor parallelism in arms: vLLM as it is (the plugin
disabled), with the thresholds, and optionally each backend forced alone.
Every arm is a fresh engine process (arxtune.harness.e2e.child) started with the
arm's environment; arms alternate A B A B ... so drift hits them alike.

Per arm it reports decode time per token (from vLLM's own request timestamps:
last token minus first token over the tokens after the first), prefill time
(first token minus scheduling), each TP worker's call counts by backend, and
whether the greedy token ids match the first vLLM-default engine's. Every arm
batches alike (the prompts submitted together, the batch pinned). Where the
arm's file routes every range away from vLLM's path to backends that gave the
baseline's bits in the sweep, the tokens must be identical; where not, a
backend that adds in another order may change greedy tokens, and the report
says per prompt where they diverged.

Result format history:
- version 1: e2e.json as written by `result.write_result` (config, provenance, per-arm summaries, ratios, engines).
- version 2: `batch` (how every arm's engine batches: prompts submitted together, the engine core in-process,
  max_num_seqs and max_num_batched_tokens pinned); per arm `loose_ranges` (ranges routed to backends not known
  to give the baseline's bits) and `divergence` (per prompt: first differing token, share identical). Tokens
  that differ where no range is loose are a failure. Version 1 results are still read.

Modules: config (the comparison and its arms), engine (one engine process),
child (what runs in that process), result (statistics, e2e.json), plot.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

from arxtune.harness.e2e.config import (
    BASELINE_ARM,
    E2E_VERSION,
    KIND,
    THRESHOLDS_ARM,
    TINY_MODEL,
    VLLM_BASELINE,
    Arm,
    E2EConfig,
    engine_spec,
    forced_thresholds,
    make_arms,
    prompt_token_ids,
    thresholds_for,
)
from arxtune.harness.e2e.engine import run_engine
from arxtune.harness.e2e.plot import plot_e2e
from arxtune.harness.e2e.result import divergence, failures, load_result, ratio, report_lines, summarize_arms, write_result
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.fileio import Staged, check_name, check_run_folder
from arxtune.runtime.runs import RunExists, new_run_dir

__all__ = [
    "BASELINE_ARM",
    "E2E_VERSION",
    "KIND",
    "THRESHOLDS_ARM",
    "TINY_MODEL",
    "VLLM_BASELINE",
    "Arm",
    "E2EConfig",
    "divergence",
    "engine_spec",
    "failures",
    "forced_thresholds",
    "load_result",
    "make_arms",
    "plot_e2e",
    "prompt_token_ids",
    "ratio",
    "report_lines",
    "run_e2e",
    "run_engine",
    "summarize_arms",
    "thresholds_for",
    "write_result",
]


def run_e2e(cfg: E2EConfig, run_id: str | None = None, say=print) -> Path:
    """Run every arm `repeats` times, alternating; write e2e.json (after each engine) and e2e.png; return the run dir."""
    spec = engine_spec(cfg)
    if cfg.thresholds:
        from arxtune.runtime.router import check_names
        from arxtune.runtime.thresholds import load

        check_names(load(cfg.thresholds), str(cfg.thresholds))  # a bad file is the user's error here, before any engine starts
    started = time.strftime("%Y%m%d-%H%M%S")
    out = check_run_folder(cfg.out, "--out directory")
    run_dir = out / check_name(run_id or f"e2e-{started}-{platform.node()}-tp{cfg.tensor_parallel_size}", "--run-id")
    if cfg.node_rank > 0:
        run_dir = run_dir.with_name(run_dir.name + f"-node{cfg.node_rank}")
    try:
        new_run_dir(run_dir.parent, run_dir.name)
    except RunExists:
        raise ArxtuneError(f"{run_dir} exists; results are never overwritten: pass another --run-id") from None
    arms = make_arms(cfg, run_dir)
    engines: list[dict] = []
    for repeat in range(cfg.repeats):
        for arm in arms:
            label = f"engine-{len(engines):02d}-{arm.name.replace(':', '-')}"
            say(f"e2e: {label} (repeat {repeat + 1}/{cfg.repeats})")
            result = run_engine(spec, arm.env, run_dir / label, cfg.timeout_s)
            if cfg.node_rank == 0:
                engines.append({"arm": arm.name, **result})
                write_result(run_dir, cfg, arms, engines, started, None)
            else:
                engines.append({"arm": arm.name})
    if cfg.node_rank == 0:
        with Staged() as staged:  # the finished result and its plot appear together
            result = write_result(run_dir, cfg, arms, engines, started, time.strftime("%Y%m%d-%H%M%S"), into=staged)
            plot_e2e(result, run_dir / "e2e.png", into=staged)
    return run_dir
