import json

import pytest

from arxtune.errors import ArxtuneError, FormatError
from arxtune.results import POINTS_FILE, PointRecord, RunMeta, RunWriter, load_run

from helpers.runs import make_run


def _meta(run_id="r1"):
    return RunMeta(run_id=run_id, world_size=2, device_type="cpu", config={}, baseline="gloo", started="now")


def test_round_trip_keeps_raw_samples(tmp_path):
    writer = RunWriter.create(tmp_path, _meta())
    record = PointRecord("gloo", "all_reduce", "float32", "eager", 1024, 1024, 2, "ok", (1.5, 2.25, 3.0))
    writer.append(record)
    writer.append(PointRecord("gloo", "all_gather", "float32", "eager", 1024, 1024, 2, "wrong", (), "rank 1: bad"))
    writer.close()
    run = load_run(tmp_path / "r1")
    assert run.records[0] == record
    frame = run.frame()
    assert frame.loc[0, "median_us"] == pytest.approx(2.25)
    assert frame.loc[1, "status"] == "wrong" and frame.loc[1, "error"] == "rank 1: bad"


def test_refuses_to_overwrite_a_run(tmp_path):
    RunWriter.create(tmp_path, _meta()).close()
    with pytest.raises(ArxtuneError, match="already exists"):
        RunWriter.create(tmp_path, _meta())


def test_torn_last_line_is_dropped_and_resume_keeps_the_rest(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048], backends=("gloo",))
    with open(run.path / POINTS_FILE, "a") as handle:
        handle.write("gloo,all_reduce,float32,eager,4096,40")  # interrupted mid-write
    writer = RunWriter.resume(run.path)
    assert set(writer.done) == {("gloo", "all_reduce", "float32", "eager", 1024), ("gloo", "all_reduce", "float32", "eager", 2048)}
    assert writer.meta.finished is None
    writer.append(PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 2, "ok", (1.0,)))
    writer.close()
    assert [r.size for r in load_run(run.path).records] == [1024, 2048, 4096]


def test_unknown_version_is_one_clear_error(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",))
    meta = json.loads((run.path / "meta.json").read_text())
    meta["version"] = 99
    (run.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="version 99 is not supported"):
        load_run(run.path)


@pytest.mark.parametrize("damage", ["header", "middle", "json"])
def test_corrupt_runs_are_rejected(tmp_path, damage):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048, 4096], backends=("gloo",))
    points = run.path / POINTS_FILE
    lines = points.read_text().splitlines()
    if damage == "header":
        lines[0] = "what,is,this"
    elif damage == "middle":
        lines[1] = lines[1].replace(",ok,", ",maybe,")
    else:
        (run.path / "meta.json").write_text("{not json")
    points.write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError):
        load_run(run.path)


def test_not_a_run(tmp_path):
    with pytest.raises(FormatError, match="not an arxtune run"):
        load_run(tmp_path)


def test_rounds_round_trip_and_feed_the_interval(tmp_path):
    writer = RunWriter.create(tmp_path, _meta())
    record = PointRecord("gloo", "all_reduce", "float32", "eager", 1024, 1024, 2, "ok", (1.0, 1.0, 3.0, 3.0), "", (2, 2))
    writer.append_group([record, PointRecord("x", "all_reduce", "float32", "eager", 1024, 1024, 2, "error", (), "boom")])
    writer.close()
    run = load_run(tmp_path / "r1")
    assert run.records[0] == record and run.records[0].round_iters == (2, 2)
    row = run.frame().iloc[0]
    assert row.rounds == 2 and (row.ci_low_us, row.ci_high_us) == (1.0, 3.0)


def test_a_version_1_run_is_refused_with_what_to_do(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",))
    meta = json.loads((run.path / "meta.json").read_text())
    meta["version"] = 1
    (run.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="version 1 is not supported.*re-run the sweep"):
        load_run(run.path)
