import json

import pytest
import torch

from arxtune.calibrate import calibrate
from arxtune.errors import FormatError
from arxtune.thresholds import Lookup, Range, Table, Thresholds, from_dict, load


def _thresholds(ranges=None, world=2):
    ranges = ranges or (Range(0, 4096, "arx"), Range(4096, None, "gloo"))
    return Thresholds("gloo", 0.05, {"run_id": "x", "hostnames": ["a", "b"]}, (Table("all_reduce", "bfloat16", world, tuple(ranges)),))


def test_round_trip(tmp_path, crossover_run):
    original = calibrate(crossover_run)
    path = original.save(tmp_path / "t.json")
    assert load(path) == original


def test_lookup_bounds_and_unknown_keys():
    lookup = Lookup(_thresholds(), 2)
    assert lookup.choose("all_reduce", torch.bfloat16, 0) == "arx"
    assert lookup.choose("all_reduce", torch.bfloat16, 4095) == "arx"
    assert lookup.choose("all_reduce", torch.bfloat16, 4096) == "gloo"
    assert lookup.choose("all_reduce", torch.float32, 16) is None
    assert not Lookup(_thresholds(), 4)


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(version=7), "version 7"),
    (lambda d: d.update(kind="other"), "not an arxtune thresholds file"),
    (lambda d: d["tables"][0]["ranges"].pop(0), "cover 0 bytes"),
    (lambda d: d["tables"][0]["ranges"][1].update(lo=5000), "gap or overlap"),
    (lambda d: d["tables"][0].update(op="all_to_all"), "unknown op"),
    (lambda d: d["tables"].append(dict(d["tables"][0])), "appears twice"),
    (lambda d: d["tables"][0]["ranges"][0].pop("backend"), "malformed"),
    (lambda d: d.pop("provenance"), "malformed"),
])
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
    assert lines[0] == "collective,min_bytes,max_bytes,backend,dtype,nNodes,nRanks"
    assert lines[1:] == ["all_reduce,0,4095,arx,bfloat16,2,2", "all_reduce,4096,-1,gloo,bfloat16,2,2"]
