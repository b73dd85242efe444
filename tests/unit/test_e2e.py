"""`arxtune e2e` without vLLM: arms, samples from request timestamps, tokens, the ratio, bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arxtune.cli import app
from arxtune.harness.e2e import (
    E2EConfig,
    divergence,
    engine_spec,
    failures,
    forced_thresholds,
    load_result,
    make_arms,
    plot_e2e,
    ratio,
    report_lines,
    summarize_arms,
    thresholds_for,
)
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.thresholds import from_dict

from helpers.routes import FileRoutes


def engine(arm: str, step_s: float, tokens=((5, 6, 7), (8, 9, 10)), rounds: int = 3, calls=None) -> dict:
    """An engine record as arxtune.harness.e2e.child writes it: every request's decode step takes step_s."""
    rnds = []
    for r in range(rounds):
        t0 = 100.0 * r
        rnds.append(
            [
                {
                    "token_ids": list(t),
                    "scheduled_ts": t0,
                    "first_token_ts": t0 + 0.01,
                    "last_token_ts": t0 + 0.01 + step_s * (len(t) - 1),
                    "generated": len(t),
                }
                for t in tokens
            ]
        )
    workers = [{"tp_rank": rank, "host": "h", "communicator": "C", "calls": calls} for rank in (0, 1)]
    return {"arm": arm, "startup_s": 1.0, "rounds": rnds, "workers": workers}


def test_samples_come_from_the_request_timestamps():
    summary = summarize_arms(["vllm"], [engine("vllm", 0.002), engine("vllm", 0.004)])["vllm"]
    assert summary["decode_us_per_token"] == pytest.approx([2000] * 3 + [4000] * 3)
    assert summary["prefill_us"] == pytest.approx([10000] * 6)
    assert summary["engines"] == 2 and summary["tokens_identical"]


def test_tokens_are_compared_with_the_first_vllm_engine_and_calls_summed_per_worker():
    calls = {"all_reduce:gloo": 3, "all_reduce:vllm": 1}
    engines = [
        engine("vllm", 0.002),
        engine("thresholds", 0.001, calls=calls),
        engine("thresholds", 0.001, calls=calls),
        engine("force:gloo", 0.003, tokens=((5, 6, 7), (8, 9, 11))),
    ]
    summary = summarize_arms(["vllm", "thresholds", "force:gloo"], engines)
    assert summary["thresholds"]["tokens_identical"] and not summary["force:gloo"]["tokens_identical"]
    assert summary["thresholds"]["calls"] == {
        "0": {"all_reduce:gloo": 6, "all_reduce:vllm": 2},
        "1": {"all_reduce:gloo": 6, "all_reduce:vllm": 2},
    }
    assert summary["vllm"]["calls"] == {"0": {}, "1": {}}


def test_ratio_interval_divides_the_interval_ends():
    fast = {"decode": {"median_us": 50.0, "ci_low_us": 40.0, "ci_high_us": 60.0}}
    base = {"decode": {"median_us": 100.0, "ci_low_us": 80.0, "ci_high_us": 125.0}}
    assert ratio(fast, base) == pytest.approx({"median": 0.5, "low": 0.32, "high": 0.75})


def test_thresholds_helper_builds_valid_files():
    t = thresholds_for(2, "bfloat16", {"all_reduce": [(0, "gloo"), (4096, "vllm_cpu")]})
    again = from_dict(json.loads(json.dumps(t.to_dict())))
    lookup = FileRoutes(again, 2)
    import torch

    assert lookup.choose("all_reduce", torch.bfloat16, 4095) == "gloo"
    assert lookup.choose("all_reduce", torch.bfloat16, 4096) == "vllm_cpu"
    forced = forced_thresholds("arx", 2, "bfloat16")
    assert {t.op for t in forced.tables} == {"all_reduce", "all_gather", "reduce_scatter"} and forced.backends == {"arx"}


def test_arms_set_the_environment_of_their_engines_and_say_what_they_route_loosely(tmp_path):
    thresholds_for(2, "bfloat16", {"all_reduce": [(0, "gloo"), (4096, "vllm_cpu")]}, bitwise=True).save(tmp_path / "t.json")
    cfg = E2EConfig(thresholds=str(tmp_path / "t.json"), force=("gloo", "vllm_cpu"))
    arms = make_arms(cfg, tmp_path)
    assert [a.name for a in arms] == ["vllm", "thresholds", "force:gloo", "force:vllm_cpu"]
    assert arms[0].env == {"ARXTUNE_VLLM_DISABLE": "1"}
    assert arms[1].env["ARXTUNE_THRESHOLDS"].endswith("t.json")
    assert from_dict(json.loads(open(arms[2].env["ARXTUNE_THRESHOLDS"]).read())).backends == {"gloo"}
    # Every range the file routes away from vLLM's path gives the baseline's bits: its tokens must be vLLM's.
    assert arms[1].loose == () and arms[3].loose == ()
    assert arms[2].loose[0] == "eager all_reduce/bfloat16 [0B, inf) -> gloo" and len(arms[2].loose) == 3  # forced: not known


def test_every_arm_batches_alike_and_the_result_says_how(tmp_path):
    cfg = E2EConfig(prompts=4, prompt_tokens=16, max_model_len=256)
    spec = engine_spec(cfg)
    assert spec["batch"] == {"engine_core": "in-process", "max_num_seqs": 4, "max_num_batched_tokens": 256}
    from arxtune.harness.e2e.child import engine_args

    args = engine_args(spec)
    assert args["max_num_seqs"] == 4 and args["max_num_batched_tokens"] == 256
    assert engine_spec(E2EConfig(prompts=64, prompt_tokens=16))["batch"]["max_num_batched_tokens"] == 1024


def test_divergence_is_per_prompt_first_differing_token_and_share_identical():
    reference = [[1, 2, 3, 4], [5, 6, 7, 8]]
    rounds = [[[1, 2, 3, 4], [5, 6, 0, 0]], [[1, 2, 3, 4], [5, 0, 7, 8]]]
    assert divergence(rounds, reference) == [
        {"prompt": 0, "first_difference": None, "identical_share": 1.0},
        {"prompt": 1, "first_difference": 1, "identical_share": 0.625},
    ]


def _result(summary):
    return {
        "kind": "arxtune-e2e",
        "version": 2,
        "summary": summary,
        "ratio_vs_vllm": {},
        "batch": {"engine_core": "in-process", "max_num_seqs": 2, "max_num_batched_tokens": 256},
        "config": {"tensor_parallel_size": 2, "model": "m", "dtype": "bfloat16", "prompts": 2, "decode_tokens": 3},
    }


def test_diverging_tokens_are_reported_as_expected_where_a_routed_range_is_not_bitwise(tmp_path):
    differ = ((5, 6, 7), (8, 4, 4))  # a backend that adds in another order: the second prompt's greedy path turns at token 1
    engines = [engine("vllm", 0.002), engine("thresholds", 0.001, tokens=differ, calls={"all_reduce:reversed": 3})]
    loose = {"thresholds": ["eager all_reduce/bfloat16 [0B, 4KiB) -> reversed"]}
    result = _result(summarize_arms(["vllm", "thresholds"], engines, loose))
    assert result["summary"]["thresholds"]["divergence"] == [
        {"prompt": 0, "first_difference": None, "identical_share": 1.0},
        {"prompt": 1, "first_difference": 1, "identical_share": 1 / 3},
    ]
    assert failures(result) == []
    lines = report_lines(result)
    assert (
        lines[0]
        == "batch: 2 prompts submitted together, engine core in-process, max_num_seqs 2, max_num_batched_tokens 256, the same in every arm"
    )
    assert "diverged" in lines[3] and "1.000 [" in lines[3]  # the decode figures stay in the arm's row
    assert lines[4].startswith(
        "thresholds: tokens diverge from vLLM's, as expected: it routes 1 range(s) to backends not known to give "
        "the baseline's bits (eager all_reduce/bfloat16 [0B, 4KiB) -> reversed)"
    )
    assert "added in another order" in lines[4] and lines[4].endswith("Not a failure.")
    assert lines[5:] == ["  prompt 0: identical, 100% of tokens identical", "  prompt 1: first differs at token 1, 33% of tokens identical"]
    (tmp_path / "e2e.json").write_text(json.dumps(result))
    assert load_result(tmp_path)["summary"]["thresholds"]["divergence"][1]["first_difference"] == 1


def test_diverging_tokens_where_every_routed_range_is_bitwise_are_a_failure():
    engines = [engine("vllm", 0.002), engine("thresholds", 0.001, tokens=((5, 6, 7), (8, 9, 4)))]
    result = _result(summarize_arms(["vllm", "thresholds"], engines, {"thresholds": []}))
    assert failures(result) == [
        "arm thresholds's tokens differ from vLLM's own though every range it routes away from vLLM's path "
        "gives the baseline's bits (first at token 2)"
    ]
    lines = report_lines(result)
    assert "DIFFERENT" in lines[3] and lines[4].startswith("thresholds: FAILED: tokens differ")
    assert failures(_result(summarize_arms(["vllm", "thresholds"], [engine("vllm", 0.002), engine("thresholds", 0.001)]))) == []


def test_the_shipped_model_runs_on_dummy_weights_with_fixed_prompts():
    spec = engine_spec(E2EConfig(prompts=3, prompt_tokens=5))
    assert spec["load_format"] == "dummy" and spec["model"].endswith("arxtune/harness/models/tiny-llama")
    assert len(spec["prompts"]) == 3 and all(len(p) == 5 and all(3 <= t < 1024 for t in p) for p in spec["prompts"])
    assert spec == engine_spec(E2EConfig(prompts=3, prompt_tokens=5))


@pytest.mark.parametrize(
    "bad",
    [
        dict(decode_tokens=1),
        dict(rounds=0),
        dict(nnodes=2, node_rank=2),
        dict(tensor_parallel_size=2, nnodes=3),
        dict(prompt_tokens=250, decode_tokens=10),
    ],
)
def test_bad_configs_are_one_error(bad):
    with pytest.raises(ArxtuneError):
        E2EConfig(**bad)


def test_report_and_plot_from_a_result(tmp_path):
    engines = [engine("vllm", 0.002), engine("thresholds", 0.001, calls={"all_reduce:gloo": 3}), engine("force:x", 0.002, calls={})]
    summary = summarize_arms(["vllm", "thresholds", "force:x"], engines)
    result = {
        "kind": "arxtune-e2e",
        "version": 1,
        "summary": summary,
        "ratio_vs_vllm": {"thresholds": ratio(summary["thresholds"], summary["vllm"])},
        "config": {"tensor_parallel_size": 2, "model": "m", "dtype": "bfloat16", "prompts": 2, "decode_tokens": 3},
        "provenance": {"host": "h"},
    }
    lines = report_lines(result)
    assert lines[0] == "batch: not pinned (an e2e result of version 1)"
    assert lines[2].startswith("vllm ") and "plugin off" in lines[2]
    assert "nothing routed" in lines[4]
    assert "identical" in lines[3] and "tp0: all_reduce:gloo 3; tp1: all_reduce:gloo 3" in lines[3]
    assert lines[-1].startswith("thresholds vs vLLM default: decode time per token x0.500")
    assert plot_e2e(result, tmp_path / "e2e.png").stat().st_size > 0
    (tmp_path / "e2e.json").write_text(json.dumps(result))
    assert load_result(tmp_path)["summary"]  # version 1 is still read
    (tmp_path / "e2e.json").write_text(json.dumps(result | {"version": 9}))
    with pytest.raises(ArxtuneError, match="version 1 or 2"):
        load_result(tmp_path)


def test_cli_rejects_a_corrupt_thresholds_file_before_starting_engines(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    result = CliRunner().invoke(app, ["e2e", "--thresholds", str(bad), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "not valid JSON" in result.output and not (tmp_path / "out").exists()


def test_cli_prints_the_report_and_exits_1_when_tokens_that_had_to_be_identical_differ(tmp_path, monkeypatch):
    engines = [engine("vllm", 0.002), engine("thresholds", 0.001, tokens=((5, 6, 7), (8, 9, 4)))]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "e2e.json").write_text(json.dumps(_result(summarize_arms(["vllm", "thresholds"], engines, {"thresholds": []}))))
    monkeypatch.setattr("arxtune.harness.e2e.run_e2e", lambda cfg, run_id=None, say=print: run_dir)  # the engines' part needs vLLM
    result = CliRunner().invoke(app, ["e2e", "--no-thresholds", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "thresholds: FAILED: tokens differ" in result.output
    assert "arxtune: error: arm thresholds's tokens differ from vLLM's own" in result.output
