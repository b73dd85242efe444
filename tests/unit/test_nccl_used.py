"""What NCCL used, as a run records it (meta.json `nccl_used`, results format 4), shows it and calibrate reads it."""

from __future__ import annotations

import csv
import json

import pytest

from arxtune.harness import nccl_facts
from arxtune.harness.calibrate import baseline_warnings
from arxtune.harness.report import nccl_line
from arxtune.harness.results import FORMAT_VERSION, load_run
from arxtune.runtime.errors import FormatError
from helpers.runs import make_run
from test_nccl_facts import ONE_TWIN_SOCKET_DEV, SOCKETS, SPARK_IB


def _with(run, records, baseline="nccl"):
    meta = json.loads((run.path / "meta.json").read_text())
    meta.update(nccl_used=records, baseline=baseline)
    (run.path / "meta.json").write_text(json.dumps(meta))
    return load_run(run.path)


def _record(log, rank=0):
    return {"rank": rank, "host": f"spark{rank}", **nccl_facts.parse_log(log).as_dict()}


def test_a_run_keeps_it_and_show_prints_it_in_one_line(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("nccl", "fast"))
    assert run.meta.version == FORMAT_VERSION >= 4 and run.meta.nccl_used is None
    run = _with(run, [_record(SPARK_IB, 0), _record(SPARK_IB, 1)])
    line = nccl_line(run.meta.nccl_used)
    assert line == (
        "nccl used: NCCL 2.29.3+cuda13.0, via NET/IB, HCAs roceP2p1s0f1:1,rocep1s0f1:1, GID 3, channels 2, "
        "algo/proto AllReduce 16384:RING/LL,4194304:RING/SIMPLE (every rank)"
    )
    assert "\n" not in line
    assert nccl_line(None).startswith("nccl used: not recorded")
    mixed = nccl_line([_record(SPARK_IB, 0), {"rank": 1, "error": "NCCL_DEBUG=WARN is set, so NCCL logs no set-up"}])
    assert "rank 0: NCCL 2.29.3" in mixed and "rank 1: not recorded (NCCL_DEBUG=WARN" in mixed


def test_calibrate_warns_when_the_nccl_baseline_ran_over_sockets_or_one_twin(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("nccl", "fast"))
    assert baseline_warnings(_with(run, [_record(SPARK_IB)])) == []
    (one_twin,) = baseline_warnings(_with(run, [_record(ONE_TWIN_SOCKET_DEV, 1)]))
    assert "rank 1" in one_twin and "one HCA (rocep1s0f1:1) of 2" in one_twin and "unfair" in one_twin
    assert any("sockets" in w for w in baseline_warnings(_with(run, [_record(SOCKETS)], baseline="torch_nccl")))
    assert baseline_warnings(_with(run, [_record(SOCKETS)], baseline="gloo")) == []


def test_a_version_3_run_without_it_still_reads(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024])
    meta = json.loads((run.path / "meta.json").read_text())
    meta["version"] = 3
    meta.pop("nccl_used")
    (run.path / "meta.json").write_text(json.dumps(meta))
    points = run.path / "points.csv"  # version 3's points have no bitwise column (version 5's last)
    rows = list(csv.reader(points.open(newline="")))
    with points.open("w", newline="") as out:
        csv.writer(out).writerows(row[:-1] for row in rows)
    assert load_run(run.path).meta.nccl_used is None


@pytest.mark.parametrize("bad", [{"rank": 0}, [{"communicators": [{"transports": "NET/IB"}]}], [{"devices": [1]}]])
def test_a_malformed_record_is_one_error(tmp_path, bad):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024])
    meta = json.loads((run.path / "meta.json").read_text())
    meta["nccl_used"] = bad
    (run.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="nccl_used"):
        load_run(run.path)


def test_the_sweep_asks_nccl_for_set_up_only_and_respects_the_users_own_settings(tmp_path):
    plan = nccl_facts.LogCapture.plan({}, str(tmp_path))
    assert plan.settings == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET,GRAPH",
        "NCCL_DEBUG_FILE": f"{tmp_path}/arxtune-nccl.%h.%p.log",
    }
    assert not {"COLL", "TUNING"} & set(plan.settings["NCCL_DEBUG_SUBSYS"].split(","))  # no line per call
    (tmp_path / "arxtune-nccl.spark0.4242.log").write_text(SPARK_IB)
    rec = plan.record("spark0.lan", 4242, 0)
    assert rec["rank"] == 0 and rec["network"] == "IB" and rec["gid_index"] == 3
    assert "cannot be read" in plan.record("spark0", 1, 0)["error"]
    warn = nccl_facts.LogCapture.plan({"NCCL_DEBUG": "WARN"}, str(tmp_path))
    assert warn.settings == {} and warn.record("h", 1, 0)["error"].startswith("NCCL_DEBUG=WARN is set")
    own = nccl_facts.LogCapture.plan({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{tmp_path}/mine.%p"}, str(tmp_path))
    (tmp_path / "mine.7").write_text(SOCKETS)
    assert own.settings == {} and own.record("h", 7, 1)["network"] == "Socket"
