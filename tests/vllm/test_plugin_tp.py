"""Two CPU processes through vLLM's own start-up with tp=2: routing by thresholds, and fallbacks.

One two-rank run (module fixture) serves every test here: the TP group's
communicator loads thresholds from the default location (HOME is a temp
dir), then the worker builds more communicators on the same group with other
thresholds files to show each fallback. The routed backend comes from
ARXTUNE_VLLM_TEST_BACKEND (default gloo; arx in the soft-RoCE guest).
"""

from __future__ import annotations

import json
import re
import socket

import pytest

from arxtune.runtime.thresholds import Fingerprint, Range, SourceRun, Table, Thresholds

from vllm_tier import TEST_BACKEND, run_tp, vllm_env

KiB = 1024
VLLM = "vllm_cpu"  # the baseline: ranges naming it stay on vLLM's own path

# case -> which path must take it (B = the routed arxtune backend, "vllm" = vLLM's code)
B = TEST_BACKEND
EXPECTED = {
    "ar_256B": "all_reduce:vllm",
    "ar_1KiB_lower_bound": f"all_reduce:{B}",  # lower bounds are inclusive
    "ar_2KiB": f"all_reduce:{B}",
    "ar_16KiB_upper_bound": "all_reduce:vllm",  # upper bounds are exclusive
    "ar_32KiB": "all_reduce:vllm",
    "ar_bf16_128B": f"all_reduce:{B}",
    "ar_int32_no_table": "all_reduce:vllm",
    "ag_dim0_256B": "all_gather:vllm",
    "ag_dim0_8KiB": f"all_gather:{B}",  # all_gather is sized by the gathered bytes
    "ag_dim1_8KiB": f"all_gather:{B}",
    "ag_dim-1_3d_8KiB": f"all_gather:{B}",
    "ag_dim1_3d_8KiB": f"all_gather:{B}",
    "rs_dim0_512B": f"reduce_scatter:{B}",
    "rs_dim1_512B": "reduce_scatter:vllm",  # only dim-0 reduce-scatters are routed
    "rs_dim0_16KiB": "reduce_scatter:vllm",
    "sp_ag_8KiB": f"all_gather:{B}",
    "sp_ag_256B": "all_gather:vllm",
    "sp_rs_512B": f"reduce_scatter:{B}",
}


def routing_thresholds(backend: str, world: int = 2) -> Thresholds:
    """A merged file as `arxtune calibrate` writes one for a deployment: eager and graph tables, two world sizes.

    At `world`, eagerly: vLLM's path everywhere except a few ranges that `backend` takes; the graph tables
    (never used on CPU: nothing is captured) and the other world size's send everything to `backend`, so a
    call that took the wrong table goes to the wrong place.
    """
    other = world + 1
    eager = (
        Table("all_reduce", "float32", world, (Range(0, KiB, VLLM), Range(KiB, 16 * KiB, backend), Range(16 * KiB, None, VLLM))),
        Table("all_reduce", "bfloat16", world, (Range(0, None, backend),)),
        Table("all_gather", "float32", world, (Range(0, 4 * KiB, VLLM), Range(4 * KiB, None, backend))),
        Table("reduce_scatter", "float32", world, (Range(0, 4 * KiB, backend), Range(4 * KiB, None, VLLM))),
    )
    everything = tuple(Table(t.op, t.dtype, t.world_size, (Range(0, None, backend),), "graph", f"w{world}", "graph") for t in eager)
    elsewhere = tuple(
        Table(t.op, t.dtype, other, (Range(0, None, backend),), mode, f"w{other}", mode) for t in eager for mode in ("eager", "graph")
    )
    eager = tuple(Table(t.op, t.dtype, t.world_size, t.ranges, "eager", f"w{world}", "eager") for t in eager)  # type: ignore[assignment]
    runs = tuple(SourceRun(f"w{w}", Fingerprint(w, "cpu", (socket.gethostname(),) * w, ("cpu",) * w)) for w in (world, other))
    return Thresholds(
        baseline=VLLM, margin=0.05, provenance={"runs": [r.run_id for r in runs]}, tables=eager + everything + elsewhere, runs=runs
    )


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    home = tmp / "home"
    good = routing_thresholds(B)
    # The default location, as `arxtune calibrate RUN --install` writes it (HOME is redirected below).
    good.save(home / ".config" / "arxtune" / "thresholds.json")
    # The same ranges, each known to give the baseline's bits: what `arxtune calibrate --invariant` writes.
    invariant = Thresholds(
        good.baseline,
        good.margin,
        good.provenance,
        runs=good.runs,
        tables=tuple(
            Table(
                t.op, t.dtype, t.world_size, tuple(Range(r.lo, r.hi, r.backend, r.source, True) for r in t.ranges), t.mode, t.run_id, t.view
            )
            for t in good.tables
        ),
    )
    files = {
        "good": good.save(tmp / "good.json"),
        "invariant": invariant.save(tmp / "invariant.json"),
        "world4": routing_thresholds(B, world=4).save(tmp / "world4.json"),
        "cannot_start": routing_thresholds("symm_mem").save(tmp / "cannot-start.json"),
    }  # needs CUDA tensors
    # A backend no arxtune knows: the file is refused as it is read (so it is written here, not saved).
    (tmp / "nosuch.json").write_text(json.dumps(routing_thresholds("gloo").to_dict()).replace('"gloo"', '"nosuch"'))
    files["nosuch_backend"] = tmp / "nosuch.json"
    (tmp / "not-json.json").write_text("{ this is not json\n")
    files["not_json"] = tmp / "not-json.json"
    future = good.to_dict() | {"version": 99}
    (tmp / "version99.json").write_text(json.dumps(future))
    files["version99"] = tmp / "version99.json"
    missing = str(tmp / "missing.json")
    spec = {
        "fallbacks": {
            "nofile": missing,
            "notjson": str(files["not_json"]),
            "version99": str(files["version99"]),
            "world4": str(files["world4"]),  # tables for worlds 4 and 5 only
            "nosuch": str(files["nosuch_backend"]),
            "cannotstart": str(files["cannot_start"]),
            "onlyrank0": [str(files["good"]), missing],
            "batchinvariant": {"path": str(files["good"]), "env": {"VLLM_BATCH_INVARIANT": "1"}},
            "batchinvariant_invariant_file": {"path": str(files["invariant"]), "env": {"VLLM_BATCH_INVARIANT": "1"}},
            "good": str(files["good"]),
        }
    }
    # The routing under test, not the start-up ladder: its verdict on these hand-made files depends on
    # the machine (the guest's emulated RDMA) and would add a warning of its own.
    env = vllm_env(HOME=str(home), ARXTUNE_VLLM_LOG="calls", ARXTUNE_BOOT="off")
    return run_tp(tmp, spec, env)


def test_every_rank_exits_cleanly(tp_run):
    """After vLLM's own teardown (destroy_model_parallel, destroy_distributed_environment: what a worker does at
    engine shutdown), each rank's interpreter ends with code 0: no thread of a process group the plugin held
    is left to abort it ("terminate called without an active exception")."""
    for rank in tp_run:
        assert rank["returncode"] == 0, rank["output"][-2000:]
        assert "terminate called" not in rank["output"] and "core dumped" not in rank["output"], rank["output"][-2000:]


def test_the_plugin_is_the_tp_communicator(tp_run):
    for rank in tp_run:
        assert rank["communicator"] == "ArxtuneCpuCommunicator"
        assert rank["is_cpu_communicator"], "the wrapper must subclass the platform's communicator"


def test_startup_says_which_ranges_it_takes(tp_run):
    rank0, rank1 = tp_run
    infos = [msg for level, msg in rank0["startup_log"] if level == "INFO" and "bytes ->" not in msg]
    assert len(infos) == 1, rank0["startup_log"]
    line = infos[0]
    assert line.startswith("arxtune: tp:0 (world 2): tables eager 4, graph 4, capacity ")
    assert "fingerprint matches run w2" in line and "overrides none" in line
    assert f"eager all_reduce/float32 [1KiB, 16KiB) -> {B}" in line
    assert f"eager all_gather/float32 [4KiB, inf) -> {B}" in line
    assert "graph " not in line.split(" takes ")[1], "the graph tables name only backends that cannot be captured"
    assert "everything else goes to vLLM's CpuCommunicator" in line
    assert ".config/arxtune/thresholds.json" in line  # found at the default location
    assert re.search(r"\); set up in [0-9]+\.[0-9]{2} s$", line), line  # the plugin's own start-up time, said
    assert not [m for lvl, m in rank0["startup_log"] if lvl == "WARNING"]
    assert not [m for lvl, m in rank1["startup_log"] if lvl == "INFO"], "one line per group, from its rank 0"
    assert "arxtune: tp:0 (world 2): tables eager" in rank0["output"], "the line goes through vLLM's log handler"


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_calls_go_where_the_thresholds_say_with_exact_results(tp_run, case):
    for rank in tp_run:
        record = rank["cases"][case]
        assert record["went"] == EXPECTED[case], f"rank {rank['rank']}: {record}"
        assert record["ok"], f"rank {rank['rank']}: {record}"


def test_every_case_was_run():
    from tp_worker import CASES

    assert set(CASES) == set(EXPECTED)


def test_calls_log_names_each_call(tp_run):
    output = tp_run[0]["output"]
    assert f"arxtune: all_reduce torch.float32 2048 bytes -> {B}" in output
    assert "arxtune: all_reduce torch.float32 256 bytes -> vllm" in output


def fallback(tp_run, label):
    rank0, rank1 = (rank["fallbacks"][label] for rank in tp_run)
    for record in (rank0, rank1):
        assert not record["routes"] and record["ok"] and record["went"] == "nothing", record
    warnings = [msg for level, msg in rank0["log"] if level == "WARNING"]
    assert len(warnings) == 1, rank0["log"]
    assert warnings[0].endswith("every call uses vLLM's CpuCommunicator")
    assert not rank1["log"]
    return warnings[0]


def test_no_file_falls_back_with_a_warning(tp_run):
    assert "no thresholds file at" in fallback(tp_run, "nofile")


def test_bad_json_falls_back_with_a_warning(tp_run):
    assert "not valid JSON" in fallback(tp_run, "notjson")


def test_unknown_version_falls_back_with_a_warning(tp_run):
    assert "version 99 is not supported" in fallback(tp_run, "version99")


def test_wrong_world_size_falls_back_with_a_warning(tp_run):
    assert "tables for world sizes [4, 5], not 2" in fallback(tp_run, "world4")


def test_backend_that_cannot_start_falls_back_with_a_warning(tp_run):
    assert "symm_mem cannot start (symm_mem needs CUDA tensors" in fallback(tp_run, "cannotstart")


def test_a_file_naming_an_unknown_backend_falls_back_with_a_warning(tp_run):
    assert "'nosuch' is unknown" in fallback(tp_run, "nosuch")


def test_ranks_that_disagree_fall_back_together(tp_run):
    assert "rank 1: no thresholds file" in fallback(tp_run, "onlyrank0")


def test_batch_invariant_vllm_refuses_a_file_not_known_to_give_the_baselines_bits(tp_run):
    warning = fallback(tp_run, "batchinvariant")
    assert (
        "vLLM runs batch-invariant and the thresholds route 8 range(s) to backends not known to give vllm_cpu's bits "
        f"(eager all_reduce/float32 [1KiB, 16KiB) -> {B}, ...); write the file with `arxtune calibrate RUN --invariant`"
    ) in warning


def test_batch_invariant_vllm_routes_by_an_invariant_file(tp_run):
    for rank in tp_run:
        record = rank["fallbacks"]["batchinvariant_invariant_file"]
        assert record["routes"] and record["ok"] and record["went"] == f"all_reduce:{B}", record
    assert not [msg for level, msg in tp_run[0]["fallbacks"]["batchinvariant_invariant_file"]["log"] if level == "WARNING"]


def test_a_good_file_routes_on_a_second_communicator(tp_run):
    for rank in tp_run:
        record = rank["fallbacks"]["good"]
        assert record["routes"] and record["ok"] and record["went"] == f"all_reduce:{B}", record
