import json

import pytest
import torch

from arxtune.harness.calibrate import calibrate
from arxtune.runtime.errors import FormatError
from arxtune.runtime.thresholds import BackendSetup, Fingerprint, Range, SourceRun, Table, Thresholds, from_dict, load

from helpers.routes import FileRoutes


def _thresholds(ranges=None, world=2):
    ranges = ranges or (Range(0, 4096, "arx"), Range(4096, None, "gloo"))
    run = SourceRun("x", Fingerprint(world, "cpu", ("a", "b"), ("cpu", "cpu")))
    return Thresholds(
        "gloo",
        0.05,
        {},
        (Table("all_reduce", "bfloat16", world, tuple(ranges), "eager", "x", "eager"),),
        runs=(run,),
        backend_setup={"arx": BackendSetup({"max_bytes": 8 << 20}, {"all_reduce": 8 << 20})},
    )


def test_round_trip(tmp_path, crossover_run):
    original = calibrate(crossover_run)
    path = original.save(tmp_path / "t.json")
    assert load(path) == original


def test_lookup_bounds_and_unknown_keys():
    lookup = FileRoutes(_thresholds(), 2)
    assert lookup.choose("all_reduce", torch.bfloat16, 0) == "arx"
    assert lookup.choose("all_reduce", torch.bfloat16, 4095) == "arx"
    assert lookup.choose("all_reduce", torch.bfloat16, 4096) == "gloo"
    assert lookup.choose("all_reduce", torch.float32, 16) is None
    assert not FileRoutes(_thresholds(), 4)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(version=7), "version 7"),
        (lambda d: d.update(kind="other"), "not an arxtune thresholds file"),
        (lambda d: d["tables"][0]["ranges"].pop(0), "cover 0 bytes"),
        (lambda d: d["tables"][0]["ranges"][1].update(lo=5000), "gap or overlap"),
        (lambda d: d["tables"][0].update(op="all_to_all"), r"tables\[0\].op 'all_to_all' is unknown"),
        (lambda d: d["tables"][0].update(mode="prefill"), r"tables\[0\].mode 'prefill' is unknown"),
        (lambda d: d.pop("runs"), "file lacks runs"),
        (lambda d: d["backend_setup"].update(arx={"capacity": {"all_to_all": 5}}), "backend_setup.arx.capacity 'all_to_all' is unknown"),
        (lambda d: d["tables"].append(dict(d["tables"][0])), "appears twice"),
        (lambda d: d["tables"][0]["ranges"][0].pop("backend"), r"tables\[0\].ranges\[0\] lacks backend"),
        (lambda d: d.pop("provenance"), "file lacks provenance"),
    ],
)
def test_validation(mutate, needle):
    data = json.loads(json.dumps(_thresholds().to_dict()))
    mutate(data)
    with pytest.raises(FormatError, match=needle):
        from_dict(data)


def test_unreadable_files(tmp_path):
    with pytest.raises(FormatError, match="not found"):
        load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(FormatError, match="not valid JSON"):
        load(bad)


def test_csv_export_is_tuner_style():
    lines = _thresholds().to_csv().splitlines()
    assert lines[0] == "collective,min_bytes,max_bytes,backend,dtype,mode,nNodes,nRanks"
    assert lines[1:] == ["all_reduce,0,4095,arx,bfloat16,eager,2,2", "all_reduce,4096,-1,gloo,bfloat16,eager,2,2"]


V1 = {
    "kind": "arxtune-thresholds",
    "version": 1,
    "baseline": "nccl",
    "margin": 0.05,
    "provenance": {
        "run_id": "old",
        "hostnames": ["a", "b"],
        "device_names": ["GB10", "GB10"],
        "world_size": 2,
        "device_type": "cuda",
        "mode": "graph",
    },
    "tables": [
        {
            "op": "all_reduce",
            "dtype": "bfloat16",
            "world_size": 2,
            "ranges": [
                {"lo": 0, "hi": 4096, "backend": "arx", "source": "measured"},
                {"lo": 4096, "hi": None, "backend": "nccl", "source": "model"},
            ],
        }
    ],
    "models": [{"backend": "arx", "op": "all_reduce", "dtype": "bfloat16", "world_size": 2, "alpha_us": 3.0, "bandwidth_gbps": 10.0}],
}


def test_version_1_is_read_as_its_one_run_and_mode(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(V1))
    t = load(path)
    assert t.version == 3 and t.table("all_reduce", "bfloat16", 2, "graph").run_id == "old"
    assert t.table("all_reduce", "bfloat16", 2, "eager") is None
    assert t.models[0].mode == "graph" and t.backend_setup == {}
    assert t.runs[0].fingerprint == Fingerprint(2, "cuda", ("a", "b"), ("GB10", "GB10"))
    assert [r.bitwise for r in t.tables[0].ranges] == [None, None]  # not known before version 3
    assert load(t.save(tmp_path / "v3.json")) == t  # saved again as version 3


def test_version_2_is_read_with_bitwise_not_known(tmp_path):
    v2 = json.loads(json.dumps(_thresholds().to_dict()))
    for table in v2["tables"]:
        for r in table["ranges"]:
            del r["bitwise"]
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(v2 | {"version": 2}))
    t = load(path)
    assert [r.bitwise for r in t.tables[0].ranges] == [None, None]
    assert t.not_bitwise(2, lambda name: False) == ["eager all_reduce/bfloat16 [0B, 4KiB) -> arx"]  # the baseline's own range is fine


def test_bitwise_is_saved_and_read_back_and_checked(tmp_path):
    table = Table(
        "all_reduce",
        "float32",
        2,
        (Range(0, 1024, "arx", "measured", True), Range(1024, 4096, "x", "measured", False), Range(4096, None, "gloo", "model", True)),
    )
    t = Thresholds("gloo", 0.05, {}, (table,))
    assert load(t.save(tmp_path / "t.json")) == t
    assert t.not_bitwise(2, lambda name: False) == ["eager all_reduce/float32 [1KiB, 4KiB) -> x"]
    assert t.not_bitwise(2, lambda name: name == "x") == [] and t.not_bitwise(3, lambda name: False) == []
    bad = json.loads((tmp_path / "t.json").read_text())
    bad["tables"][0]["ranges"][0]["bitwise"] = "yes"
    with pytest.raises(FormatError, match=r"tables\[0\].ranges\[0\].bitwise must be true, false or null"):
        from_dict(bad)


def test_both_modes_of_one_key_are_two_tables():
    eager = Table("all_reduce", "float32", 2, (Range(0, None, "gloo"),), "eager")
    graph = Table("all_reduce", "float32", 2, (Range(0, None, "arx"),), "graph")
    t = from_dict(json.loads(json.dumps(Thresholds("gloo", 0.05, {}, (eager, graph)).to_dict())))
    assert FileRoutes(t, 2, mode="graph").choose("all_reduce", torch.float32, 1) == "arx"
    assert FileRoutes(t, 2, mode="eager").choose("all_reduce", torch.float32, 1) == "gloo"


def test_fingerprint_names_what_differs_and_skips_what_is_unknown():
    recorded = Fingerprint(2, "cuda", ("a", "b"), ("GB10", "GB10"), "580.1", "2.13.0", "2.28.9", ("rocep1s0f1",))
    assert recorded.differences(Fingerprint(2, "cuda", ("b", "a"), ("GB10", "GB10"), "580.1", "2.13.0", "2.28.9", ("rocep1s0f1",))) == []
    running = Fingerprint(2, "cuda", ("a", "c"), ("GB10", "GB10"), "575.0", "2.13.0", "2.28.9", ())
    assert recorded.differences(running) == ["hostnames a,b vs a,c", "driver_version 580.1 vs 575.0", "rdma_devices rocep1s0f1 vs none"]
    assert Fingerprint(2).differences(running) == []  # nothing recorded, nothing to compare
