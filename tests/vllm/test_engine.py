"""vLLM's engine (TP=2, the shipped tiny Llama config, dummy weights) generating tokens with the plugin.

`arxtune e2e` runs two engines, vLLM as it is and with thresholds whose
ranges send decode-sized all-reduces and the logits all-gather to the routed
backend and everything else to vLLM's path. The routed backend adds the
ranks' values in reverse order; at TP=2 that is one rounding of a + b, the
baseline's bits, and the file says so (as `arxtune calibrate` writes it from
a TP=2 sweep), so the greedy tokens must be identical, and e2e fails if they
are not. Every TP worker's counts must show both all-reduce ranges taken, and
every call the plugin logged must have gone where its size's range says;
every step holds all four prompts (the batch is pinned), so the logits
all-gather is always the full batch's. Then a
wrong-world-size and a corrupt thresholds file each start an engine: one
warning, vLLM's own path, the same tokens. The routed arm starts with the
start-up ladder in `check`, one more engine with it in `adjust`: each
plugin's start-up line carries the ladder's verdict, and the tokens are
vLLM's own. The routed backend comes from ARXTUNE_VLLM_TEST_BACKEND (arx
inside the soft-RoCE guest); with the default (gloo) it is the tests'
`reversed` site backend (gloo's traffic, the sum in reverse rank order).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from arxtune.harness.e2e import E2EConfig, engine_spec, run_engine, thresholds_for

from vllm_tier import HERE, ROOT, RUN_TIMEOUT_S, TEST_BACKEND, vllm_env

KiB = 1024
VLLM = "vllm_cpu"
B = "reversed" if TEST_BACKEND == "gloo" else TEST_BACKEND
#: Where the engines find the `reversed` site backend.
SITE = dict(
    ARXTUNE_EXTRA_BACKENDS="reversed=helpers.backends:ReversedSum",
    PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])),
)
#: Small and quick: 4 prompts of 16 tokens, 8 generated each. Decode all-reduces are 4 x 256 x 2 B = 2 KiB,
#: prefill all-reduces 64 x 256 x 2 B = 32 KiB; the logits all-gather is 4 x 1024 x 2 B = 8 KiB.
SHAPE = dict(prompts=4, prompt_tokens=16, decode_tokens=8, rounds=2)
#: Engine start-up is ~1 min on a 2-core machine; far longer in the guest.
ENGINE_TIMEOUT_S = max(600.0, RUN_TIMEOUT_S)
#: The module's engines start inside the first test that needs them.
pytestmark = pytest.mark.timeout(3 * ENGINE_TIMEOUT_S)


#: Decode-sized all-reduces and the logits all-gather of a full batch to B; prefill sizes and the
#: all-gather of a step that holds fewer prompts to vLLM's path.
ROUTED = {"all_reduce": [(0, B), (4 * KiB, VLLM)], "all_gather": [(0, VLLM), (8 * KiB, B)]}


def routed_thresholds(world: int = 2):
    """Every range to B gives the baseline's bits, as a TP=2 sweep finds for any backend that adds correctly."""
    return thresholds_for(world, "bfloat16", ROUTED, run_id="tests-vllm-engine", bitwise=True)


def routed_to(op: str, nbytes: int) -> str:
    """The plugin's counter name for where ROUTED sends `op` at `nbytes`."""
    name = [backend for lower, backend in ROUTED[op] if lower <= nbytes][-1]
    return "vllm" if name == VLLM else name


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """`arxtune e2e` with the routed thresholds: its e2e.json."""
    tmp = tmp_path_factory.mktemp("e2e")
    path = routed_thresholds().save(tmp / "routed.json")
    args = [
        "--thresholds",
        str(path),
        "--repeats",
        "1",
        "--rounds",
        str(SHAPE["rounds"]),
        "--prompts",
        str(SHAPE["prompts"]),
        "--prompt-tokens",
        str(SHAPE["prompt_tokens"]),
        "--decode-tokens",
        str(SHAPE["decode_tokens"]),
        "--out",
        str(tmp),
        "--run-id",
        "run",
        "--timeout-s",
        str(ENGINE_TIMEOUT_S),
    ]
    # the start-up ladder's default policy, said; one log line per call
    env = vllm_env(ARXTUNE_BOOT="check", ARXTUNE_BOOT_OUT=str(tmp / "boot"), ARXTUNE_VLLM_LOG="calls", **SITE)
    proc = subprocess.run(
        [sys.executable, "-m", "arxtune", "e2e", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2 * ENGINE_TIMEOUT_S + 60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    result = json.loads((tmp / "run" / "e2e.json").read_text())
    result["stdout"] = proc.stdout
    result["run_dir"] = tmp / "run"
    return result


def test_same_tokens_with_and_without_the_plugin(compared):
    summary = compared["summary"]
    assert set(summary) == {"vllm", "thresholds"}
    assert summary["thresholds"]["tokens_identical"] and summary["thresholds"]["loose_ranges"] == []  # required, and so
    assert "thresholds    " in compared["stdout"] and "identical" in compared["stdout"]
    assert compared["batch"] == {"engine_core": "in-process", "max_num_seqs": 4, "max_num_batched_tokens": 256}
    assert compared["stdout"].startswith("batch: 4 prompts submitted together, engine core in-process")
    assert "thresholds vs vLLM default: decode time per token x" in compared["stdout"]
    assert (compared["run_dir"] / "e2e.png").stat().st_size > 0


#: The plugin's line for one call under ARXTUNE_VLLM_LOG=calls.
CALL_LINE = re.compile(r"\(Worker_TP(\d) .*\] arxtune: (all_reduce|all_gather|reduce_scatter) torch\.bfloat16 (\d+) bytes -> (\S+)$")


def test_every_worker_took_both_kinds_of_range(compared):
    engines = {e["arm"]: e for e in compared["engines"]}
    plain = engines["vllm"]["workers"]
    assert [w["calls"] for w in plain] == [None, None], "the plugin is off in vLLM's own arm"
    routed = engines["thresholds"]["workers"]
    assert sorted(w["tp_rank"] for w in routed) == [0, 1]
    for worker in routed:
        calls = worker["calls"]
        assert worker["communicator"] == "ArxtuneCpuCommunicator"
        assert calls.get(f"all_reduce:{B}", 0) > 0 and calls.get("all_reduce:vllm", 0) > 0, worker
        assert calls.get(f"all_gather:{B}", 0) > 0, worker
        # decode steps (8 per prompt batch, 2 layers x 2 all-reduces each) all went to B
        assert calls[f"all_reduce:{B}"] >= SHAPE["rounds"] * (SHAPE["decode_tokens"] - 1) * 4, worker


def test_every_logged_call_went_where_its_size_says(compared):
    log = (compared["run_dir"] / "engine-01-thresholds.log").read_text()
    logged = [m.groups() for m in map(CALL_LINE.search, log.splitlines()) if m]
    routed = {e["arm"]: e for e in compared["engines"]}["thresholds"]["workers"]
    for worker in routed:
        mine = [(op, int(nbytes), took) for rank, op, nbytes, took in logged if int(rank) == worker["tp_rank"]]
        assert len(mine) == sum(worker["calls"].values()), "one line per counted call"
        wrong = [(op, nbytes, took) for op, nbytes, took in mine if took != routed_to(op, nbytes)]
        assert not wrong, wrong[:5]
        # Every step holds the whole batch: the logits all-gather is always 4 x 1024 x 2 B, an all-reduce a decode
        # step's (or a prefill served from the prefix cache) or the batch's prefill.
        assert {nbytes for op, nbytes, _ in mine if op == "all_gather"} == {8 * KiB}
        assert 2 * KiB in {nbytes for op, nbytes, _ in mine if op == "all_reduce"} <= {2 * KiB, 32 * KiB}


#: What a process that dies at exit leaves in the log it shares with its engine (a C++ std::terminate, a signal).
DIED_AT_EXIT = ("terminate called", "Aborted", "core dumped", "Fatal Python error", "SIGABRT", "SIGSEGV")


def test_the_workers_exit_cleanly_at_engine_shutdown(compared):
    """The plugin's workers let go of every process group its dispatch held when vLLM destroys its own (the
    communicator's destroy()), so none aborts as the interpreter finalizes. Where vLLM's engine core never took
    its SIGTERM (seen once in vLLM's own arm on the loaded 2-core box), vLLM killed the workers before they were
    asked to leave, and there is nothing to judge but the absence of an abort."""
    for name in ("engine-00-vllm.log", "engine-01-thresholds.log"):
        log = (compared["run_dir"] / name).read_text()
        found = [line for line in log.splitlines() if any(sign in line for sign in DIED_AT_EXIT)]
        assert not found, f"{name}: {found[:5]}"
        asked = "[shutdown] Executor: waiting for worker exit" in log
        assert not asked or "[shutdown] Executor: all workers exited gracefully" in log, f"{name}: the workers did not end when asked"
        if name.startswith("engine-01") and not asked:
            pytest.skip("vLLM's engine core never took its SIGTERM: its workers were killed before they were asked to leave")


def test_timings_come_from_vllm_request_metrics(compared):
    for arm in ("vllm", "thresholds"):
        s = compared["summary"][arm]
        assert len(s["decode_us_per_token"]) == SHAPE["rounds"]
        assert all(v > 0 for v in s["decode_us_per_token"] + s["prefill_us"])
        assert s["decode"]["ci_low_us"] <= s["decode"]["median_us"] <= s["decode"]["ci_high_us"]


def _plugin_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"\bWARNING\b.*\] arxtune: ", line)]


@pytest.mark.parametrize("case", ["world4", "corrupt"])
def test_bad_thresholds_at_engine_start_warn_once_and_keep_tokens(compared, tmp_path, case):
    path = tmp_path / f"{case}.json"
    if case == "world4":
        routed_thresholds(world=4).save(path)
    else:
        path.write_text('{"kind": "arxtune-thresholds", "version": 1, "tables": [')
    spec = engine_spec(E2EConfig(**SHAPE))  # type: ignore[arg-type]
    result = run_engine(spec, {"ARXTUNE_THRESHOLDS": str(path), **SITE}, tmp_path / case, ENGINE_TIMEOUT_S)
    log = (tmp_path / f"{case}.log").read_text()
    warnings = _plugin_warnings(log)
    assert len(warnings) == 1, warnings
    assert ("world" in warnings[0]) if case == "world4" else ("JSON" in warnings[0])
    for worker in result["workers"]:
        assert all(key.endswith(":vllm") for key in worker["calls"] or {}), worker
    reference = json.loads((compared["run_dir"] / "engine-00-vllm.json").read_text())
    assert [[r["token_ids"] for r in rnd] for rnd in result["rounds"]] == [[r["token_ids"] for r in rnd] for rnd in reference["rounds"]]


#: The start-up ladder's part of the plugin's line: its policy, the two boundaries and each one's verdict.
LADDER_LINE = r"ladder {policy}: 2 boundaries, .*\((all_reduce|all_gather)/bfloat16 \S+ \S+ (held|contradicted|unclear|not judged|-> \S+).*\) in [0-9.]+ s of"


def _ladder_lines(log: str, policy: str) -> list[str]:
    return [line for line in log.splitlines() if "arxtune: " in line and re.search(LADDER_LINE.format(policy=policy), line)]


def test_the_routed_engine_started_with_the_ladder_in_check_and_said_its_verdict(compared):
    log = (compared["run_dir"] / "engine-01-thresholds.log").read_text()
    lines = _ladder_lines(log, "check")
    assert len(lines) == 1, [line for line in log.splitlines() if "arxtune" in line]
    assert list((compared["run_dir"].parent / "boot").glob("boot-w2-*/points.csv")), "rank 0 wrote the ladder's run"


def test_the_engine_starts_with_the_ladder_in_adjust_and_keeps_vllms_tokens(compared, tmp_path):
    path = routed_thresholds().save(tmp_path / "routed.json")
    spec = engine_spec(E2EConfig(**SHAPE))  # type: ignore[arg-type]
    env = {"ARXTUNE_THRESHOLDS": str(path), "ARXTUNE_BOOT": "adjust", "ARXTUNE_BOOT_OUT": str(tmp_path / "boot"), **SITE}
    result = run_engine(spec, env, tmp_path / "adjust", ENGINE_TIMEOUT_S)
    log = (tmp_path / "adjust.log").read_text()
    assert len(_ladder_lines(log, "adjust")) == 1, [line for line in log.splitlines() if "arxtune" in line]
    reference = json.loads((compared["run_dir"] / "engine-00-vllm.json").read_text())
    assert [[r["token_ids"] for r in rnd] for rnd in result["rounds"]] == [[r["token_ids"] for r in rnd] for rnd in reference["rounds"]]
