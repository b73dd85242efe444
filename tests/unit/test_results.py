import json
import os

import pytest

from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.harness.results import POINT_COLUMNS, POINTS_FILE, PointRecord, RunExists, RunMeta, RunWriter, load_run
from arxtune.harness.sweep import new_run_id

from helpers.runs import make_run

ITERS, ROUNDS, SAMPLES = (POINT_COLUMNS.index(c) for c in ("iters", "round_iters", "samples_us"))


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


def test_torn_last_line_is_cut_on_resume_and_every_complete_line_kept(tmp_path, caplog):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048], backends=("gloo",), finished=False)
    points = run.path / POINTS_FILE
    kept = points.read_bytes()
    with open(points, "a") as handle:
        handle.write("gloo,all_reduce,float32,eager,4096,40")  # interrupted mid-write
    writer = RunWriter.resume(run.path)
    assert "cut a torn last line" in caplog.text
    assert points.read_bytes() == kept
    assert set(writer.done) == {("gloo", "all_reduce", "float32", "eager", 1024), ("gloo", "all_reduce", "float32", "eager", 2048)}
    writer.append(PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 2, "ok", (1.0,)))
    writer.close()
    assert points.read_bytes().startswith(kept)
    assert [r.size for r in load_run(run.path).records] == [1024, 2048, 4096]


def test_damage_before_the_last_line_is_an_error_and_resume_changes_nothing(tmp_path):
    """A stray quote six lines before the end must not make the loader drop the rest as 'torn'."""
    run = make_run(tmp_path, lambda b, n: 10.0, [1 << k for k in range(10, 20)], backends=("gloo",), finished=False)
    points = run.path / POINTS_FILE
    lines = points.read_bytes().split(b"\r\n")
    lines[-7] = lines[-7].replace(b",eager,", b',"eager,', 1)
    damaged = b"\r\n".join(lines)
    points.write_bytes(damaged)
    with pytest.raises(FormatError, match=r"points.csv:6: unexpected end of data; .*only a torn last line may be cut"):
        load_run(run.path)
    with pytest.raises(FormatError):
        RunWriter.resume(run.path)
    assert points.read_bytes() == damaged


def test_an_oversized_field_mid_file_is_one_error(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048, 4096], backends=("gloo",))
    points = run.path / POINTS_FILE
    lines = points.read_text().splitlines()
    lines[2] = lines[2] + '"' + "x" * 200_000 + '"'
    points.write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError, match="points.csv:3"):
        load_run(run.path)


def test_a_finished_run_is_not_resumed(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",))
    before = (run.path / "meta.json").read_bytes()
    with pytest.raises(ArxtuneError, match="nothing to resume"):
        RunWriter.resume(run.path)
    assert (run.path / "meta.json").read_bytes() == before


def test_a_taken_run_directory_is_never_reused(tmp_path):
    RunWriter.create(tmp_path, _meta()).close()
    with pytest.raises(RunExists, match="already exists"):
        RunWriter.create(tmp_path, _meta())
    with pytest.raises(ArxtuneError, match="is a file"):
        RunWriter.create(tmp_path / "r1" / POINTS_FILE, _meta("r2"))


def test_run_ids_of_sweeps_started_together_differ():
    assert len({new_run_id(2, "cpu") for _ in range(200)}) == 200


def test_unknown_version_is_one_clear_error(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",))
    meta = json.loads((run.path / "meta.json").read_text())
    meta["version"] = 99
    (run.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="version 99 is not supported"):
        load_run(run.path)


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("header", "unexpected columns"),
        (",ok,->,maybe,", "points.csv:3: unknown op, dtype, view or status"),
        (",float32,->,float99,", "points.csv:3: unknown op"),
        (",2048,2048,->,-2048,-2048,", "points.csv:3: sizes must be positive"),
        (",2,ok,->,3,ok,", "points.csv:3: world size 3"),
        ("gloo,->ghost,", "points.csv:3: backend 'ghost'"),
        ("fields", f"points.csv:3: {len(POINT_COLUMNS) - 1} fields"),
        ("samples nan", "points.csv:3: samples must be positive"),
        ("samples inf", "points.csv:3: samples must be positive"),
        ("samples 0", "points.csv:3: samples must be positive"),
        ("ok without samples", "points.csv:3: sample count"),
        ("duplicate", "points.csv:4: point .* appears twice"),
    ],
)
def test_corrupt_points_are_rejected_naming_the_line(tmp_path, damage, needle):
    """Line 3 is a real middle line (header, 1024, 2048, 4096): damage there must never be dropped silently."""
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048, 4096], backends=("gloo",))
    points = run.path / POINTS_FILE
    lines = points.read_text().splitlines()
    fields = lines[2].split(",")
    if damage == "header":
        lines[0] = "what,is,this"
    elif "->" in damage:
        old, new = damage.split("->")
        assert old in lines[2]
        lines[2] = lines[2].replace(old, new, 1)
    elif damage == "fields":
        lines[2] = ",".join(fields[:-1])
    elif damage.startswith("samples "):
        fields[SAMPLES] = fields[SAMPLES].replace(fields[SAMPLES].split()[5], damage.split()[1], 1)
        lines[2] = ",".join(fields)
    elif damage == "ok without samples":
        fields[ITERS], fields[ROUNDS], fields[SAMPLES] = "0", "", ""
        lines[2] = ",".join(fields)
    else:
        lines[3] = lines[2]
    points.write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError, match=needle):
        load_run(run.path)


@pytest.mark.parametrize(
    "meta_text, needle",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "meta.json must be an object"),
        ("world_size two", "world_size must be a whole number, not 'two'"),
        ("hostnames 5", "hostnames must be a list, not 5"),
    ],
)
def test_corrupt_meta_is_rejected(tmp_path, meta_text, needle):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",))
    meta = json.loads((run.path / "meta.json").read_text())
    if meta_text.startswith("world_size"):
        meta["world_size"] = "two"
        meta_text = json.dumps(meta)
    elif meta_text.startswith("hostnames"):
        meta["hostnames"] = 5
        meta_text = json.dumps(meta)
    (run.path / "meta.json").write_text(meta_text)
    with pytest.raises(FormatError, match=needle):
        load_run(run.path)


@pytest.mark.parametrize("kind", ["fifo", "binary", "directory"])
def test_unreadable_run_files_are_one_error_and_never_block(tmp_path, kind):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",))
    target = run.path / POINTS_FILE
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "binary":
        target.write_bytes(b"backend\xff\xfe\n")
    else:
        target.mkdir()
    with pytest.raises(FormatError, match="not an arxtune run|not a regular file|not UTF-8"):
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


def without_bitwise(points):
    """points.csv as versions 2 and 3 wrote it: no `bitwise` column (the last one)."""
    lines = points.read_text().splitlines()
    assert lines[0].endswith(",bitwise")
    points.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in lines))


def test_a_version_2_run_is_read_and_resumed_in_its_own_format(tmp_path):
    """Version 2 called the timing view `mode` (points.csv column, config key); it still loads and resumes."""
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048], backends=("gloo",), finished=False)
    meta_path, points = run.path / "meta.json", run.path / POINTS_FILE
    meta = json.loads(meta_path.read_text())
    meta.update(version=2, config={"modes": ["eager"], "step_factor": 2.0})
    meta_path.write_text(json.dumps(meta))
    without_bitwise(points)
    points.write_bytes(points.read_bytes().replace(b",view,", b",mode,", 1))
    old = load_run(run.path)
    assert old.meta.version == 2 and [r.view for r in old.records] == ["eager", "eager"]
    assert list(old.frame()["view"]) == ["eager", "eager"]
    writer = RunWriter.resume(run.path)
    writer.append(PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 2, "ok", (1.0,)))
    writer.write_meta()
    writer.close()
    again = load_run(run.path)
    assert again.meta.version == 2 and [r.size for r in again.records] == [1024, 2048, 4096]
    assert points.read_bytes().startswith(b"backend,op,dtype,mode,")


@pytest.mark.parametrize("version", [3, 4])
def test_a_run_before_the_bitwise_column_reads_with_bitwise_unknown_and_resumes_in_its_own_format(tmp_path, version):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024, 2048], backends=("gloo",), finished=False)
    meta_path, points = run.path / "meta.json", run.path / POINTS_FILE
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"version": version}))
    without_bitwise(points)
    old = load_run(run.path)
    assert [r.bitwise for r in old.records] == [None, None] and old.frame().bitwise.isna().all()
    writer = RunWriter.resume(run.path)
    writer.append(PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 2, "ok", (1.0,), bitwise=True))
    writer.close()
    assert [len(line.split(",")) for line in points.read_text().splitlines()] == [len(POINT_COLUMNS) - 1] * 4
    assert [r.bitwise for r in load_run(run.path).records] == [None, None, None]


def test_bitwise_is_stored_and_read_back(tmp_path):
    run = make_run(tmp_path, lambda b, n: 10.0, [1024], backends=("gloo",), finished=False)
    writer = RunWriter.resume(run.path)
    writer.append(PointRecord("gloo", "all_reduce", "float32", "eager", 2048, 2048, 2, "ok", (1.0,), bitwise=True))
    writer.append(PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 2, "ok", (1.0,), bitwise=False))
    writer.close()
    assert [r.bitwise for r in load_run(run.path).records] == [None, True, False]
    points = run.path / POINTS_FILE
    points.write_text(points.read_text().replace(",0\n", ",maybe\n"))
    with pytest.raises(FormatError, match="points.csv:4: bitwise must be 1, 0 or empty"):
        load_run(run.path)


def test_metadata_with_a_number_json_cannot_hold_is_refused_and_the_earlier_file_kept(tmp_path):
    from arxtune.harness import results
    from arxtune.runtime.errors import ArxtuneError

    path = tmp_path / "meta.json"
    path.write_text('{"fabric_floor_us": 24.6}\n')
    with pytest.raises(ArxtuneError, match="not finite"):
        results._write_json_atomic(path, {"fabric_floor_us": float("inf")})
    assert path.read_text() == '{"fabric_floor_us": 24.6}\n'


def test_a_point_or_a_whole_run_with_a_sample_that_is_not_finite_is_refused_and_nothing_is_left(tmp_path):
    from arxtune.runtime import runs

    bad = PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 1, "ok", (1.0, float("nan")), round_iters=(2,))
    meta = RunMeta(run_id="r", world_size=1, device_type="cpu", config={}, baseline="gloo", started="2026-12-07T00:00:00+00:00")
    with pytest.raises(ArxtuneError, match="not finite"):
        runs.write_run(tmp_path, meta, [bad])
    assert not (tmp_path / "r").exists()
    good = PointRecord("gloo", "all_reduce", "float32", "eager", 4096, 4096, 1, "ok", (1.0, 2.0), round_iters=(2,))
    path = runs.write_run(tmp_path, meta, [good])
    assert [r.samples_us for r in load_run(path).records] == [(1.0, 2.0)]
    with pytest.raises(runs.RunExists):
        runs.write_run(tmp_path, meta, [good])
