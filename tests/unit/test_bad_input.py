"""Bad input, by class: one line, a non-zero exit, no hang and nothing already written lost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arxtune.runtime.backends import parse_extra
from arxtune.cli import app
from arxtune.runtime.dispatch import read_thresholds
from arxtune.harness.config import load_config
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.fileio import read_text, write_text_atomic
from arxtune.harness.results import POINT_COLUMNS, POINTS_FILE

runner = CliRunner()


def one_line_error(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("arxtune: error:"), result.output
    return lines[0]


def _fifo(tmp_path, name="pipe.json") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# Hangs: special files are refused at once, never read.


@pytest.mark.timeout(20)
def test_special_files_are_refused_without_blocking(crossover_run, tmp_path):
    fifo = _fifo(tmp_path)
    assert "not a regular file" in one_line_error("show", fifo)
    assert "not a regular file" in one_line_error("show", "/dev/zero")
    assert "not a regular file" in one_line_error("plot", crossover_run.path, "--thresholds", fifo)
    assert "not a regular file" in one_line_error("sweep", "--config", fifo)
    thresholds, _, why = read_thresholds(2, fifo)  # what Communicator.from_env(FIFO) reads through
    assert thresholds is None and "not a regular file" in why


def test_large_and_binary_files_are_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    with pytest.raises(ArxtuneError, match="larger than"):
        read_text(big, "thresholds file", limit=1000)
    binary = tmp_path / "t.json"
    binary.write_bytes(b'{"kind": "\xff"}')
    assert "not UTF-8" in one_line_error("show", binary)


# Tracebacks: malformed configs, runs and environment are one line each.


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"[sweep]\nbackends = 5\n", "backends must be a list of names"),
        (b"[sweep]\ntimeout_s = nan\n", "timeout_s must be positive"),
        (b"[sweep]\nstep_factor = nan\n", "step_factor must be a number greater than 1"),
        (b"[sweep]\nstep_factor = 1.000001\n", "at most 200"),
        (b"[sweep]\nmax_bytes = '4096GiB'\n", "above 16GiB"),
        (b"[sweep]\nmax_bytes = '" + b"9" * 400 + b"'\n", r"max_bytes: size 9{37}\.\.\. is above 1048576GiB"),
        (b"[sweep]\nmin_bytes = '" + b"9" * 5000 + b"'\n", r"min_bytes: size 9{37}\.\.\. is above"),
        (b"\xef\xbb\xbf[sweep]\nmax_bytes = '1MiB'\n", "starts with a UTF-8 byte-order mark"),
        (b"[sweep]\nbackend_options = 'arx'\n", "backend_options must be a table"),
        (b"[sweep]\nbackend_options = {arx = 3}\n", "backend_options.arx must be a table"),
        (b"[sweep]\nwarmup_iters = true\n", "warmup_iters must be a whole number"),
        (b"[sweep]\nbaseline = 'unknown'\n", "unknown baseline"),
        (b"sweep = 5\n", "must be a table"),
        (b"[sweep]\nops = ['all_reduce\xff']\n", "not UTF-8"),
    ],
)
def test_bad_configs_are_one_line(tmp_path, body, needle):
    path = tmp_path / "bad.toml"
    path.write_bytes(body)
    with pytest.raises(ArxtuneError, match=needle):
        load_config(path)
    assert needle.split()[0] in one_line_error("sweep", "--config", path)


def test_a_directory_given_as_a_config(tmp_path):
    assert "is a directory" in one_line_error("sweep", "--config", tmp_path)


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--step-factor", "nan"], "step_factor must be a number"),
        (["--step-factor", "1.000001"], "sizes (at most 200)"),
        (["--max-bytes", "4096GiB"], "above 16GiB"),
        (["--min-bytes", "9" * 5000], "min_bytes: size 9999"),
    ],
)
def test_bad_sweep_flags_are_refused_before_launching(tmp_path, monkeypatch, flags, needle):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert needle in one_line_error("sweep", *flags, "--out", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_sweep_out_that_cannot_hold_runs(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "file").write_text("keep")
    assert "is a file, not a directory" in one_line_error("sweep", "--out", tmp_path / "file")
    assert "cannot create --out directory /proc/x" in one_line_error("sweep", "--out", "/proc/x")
    assert (tmp_path / "file").read_text() == "keep"


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("meta list", "meta.json must be an object"),
        ("meta binary", "not UTF-8"),
        ("points binary", "not UTF-8"),
        ("nan sample", "samples must be positive"),
        ("zero sample", "samples must be positive"),
    ],
)
def test_corrupt_runs_are_one_line_for_every_command(crossover_run, damage, needle):
    path = crossover_run.path
    if damage == "meta list":
        (path / "meta.json").write_text("[1, 2]")
    elif damage == "meta binary":
        (path / "meta.json").write_bytes(b'{"version": "\xff"}')
    elif damage == "points binary":
        with open(path / POINTS_FILE, "ab") as handle:
            handle.write(b"\xff\xfe\n")
    else:
        lines = (path / POINTS_FILE).read_text().splitlines()
        fields = lines[3].split(",")
        samples = fields[POINT_COLUMNS.index("samples_us")].split()
        samples[7] = "nan" if damage == "nan sample" else "0.000"
        fields[POINT_COLUMNS.index("samples_us")] = " ".join(samples)
        lines[3] = ",".join(fields)
        (path / POINTS_FILE).write_text("\n".join(lines) + "\n")
    before = _snapshot(path)
    for command in (["show", path], ["calibrate", path], ["plot", path]):
        assert needle in one_line_error(*command)
    assert _snapshot(path) == before


# Outputs: refused before any work, written whole or not at all, no .tmp left behind.


@pytest.mark.parametrize("command", ["calibrate", "plot"])
def test_bad_out_paths_are_refused_and_leave_nothing(crossover_run, tmp_path, command):
    name = "t.json" if command == "calibrate" else "p.png"
    (tmp_path / "file").write_text("keep")
    (tmp_path / "dir.png").mkdir()
    before = _snapshot(crossover_run.path)
    assert "is a directory" in one_line_error(command, crossover_run.path, "--out", tmp_path / "dir.png")
    assert "is a file, not a directory" in one_line_error(command, crossover_run.path, "--out", tmp_path / "file" / name)
    assert "cannot create" in one_line_error(command, crossover_run.path, "--out", f"/proc/x/{name}")
    assert (tmp_path / "file").read_text() == "keep"
    assert _snapshot(crossover_run.path) == before
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_tmp(tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    target.write_text("old")

    def no_space(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(ArxtuneError, match="No space left"):
        write_text_atomic(target, "new", "thresholds file")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.json"]


# Accepted when it should be refused.


def test_calibrate_refuses_bad_settings_before_writing(crossover_run):
    for args, needle in (
        (["--export", "xml"], "unknown --export"),
        (["--margin", "nan"], "--margin must be a number"),
        (["--baseline", "unknown"], "baseline 'unknown' was not measured"),
    ):
        assert needle in one_line_error("calibrate", crossover_run.path, *args)
        assert not (crossover_run.path / "thresholds.json").exists()


def test_extra_backends_from_the_environment():
    extra, problems = parse_extra("mine=pkg.mod:Cls, gloo=pkg.mod:Other,junk,also=nomodule")
    assert extra == {"mine": "pkg.mod:Cls"}
    assert problems == [
        "'gloo' is already a backend; pick another name",
        "'junk' must look like name=package.module:Class",
        "'also=nomodule' must look like name=package.module:Class",
    ]


def test_a_malformed_extra_backends_variable_breaks_only_sweep(crossover_run):
    env = {**os.environ, "ARXTUNE_EXTRA_BACKENDS": "gloo=x.y:Z,junk"}
    env.pop("RANK", None)
    sweep = subprocess.run([sys.executable, "-m", "arxtune", "sweep"], env=env, capture_output=True, text=True, timeout=60)
    assert sweep.returncode == 2 and sweep.stderr.splitlines() == [
        "arxtune: error: ARXTUNE_EXTRA_BACKENDS: 'gloo' is already a backend; pick another name; "
        "'junk' must look like name=package.module:Class; fix or unset it"
    ]
    show = subprocess.run(
        [sys.executable, "-m", "arxtune", "show", crossover_run.path], env=env, capture_output=True, text=True, timeout=60
    )
    assert show.returncode == 0, show.stderr


def test_resume_refuses_before_launching(crossover_run, tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    path = crossover_run.path
    assert "nothing to resume" in one_line_error("sweep", "--resume", path)
    meta = json.loads((path / "meta.json").read_text())
    meta["finished"], meta["config"] = None, {"colour": "blue"}
    (path / "meta.json").write_text(json.dumps(meta))
    before = _snapshot(path)
    assert "has a config this arxtune cannot use (unknown config key(s) colour" in one_line_error("sweep", "--resume", path)
    meta["config"] = {"step_factor": 2.0}
    (path / "meta.json").write_text(json.dumps(meta))
    assert "drop --run-id" in one_line_error("sweep", "--resume", path, "--run-id", "x")
    assert "drop --max-bytes (the run has 16777216)" in one_line_error("sweep", "--resume", path, "--max-bytes", "1MiB")
    meta["config"] = {"colour": "blue"}
    (path / "meta.json").write_text(json.dumps(meta))
    assert _snapshot(path) == before


# Round two (issue 27): one regression test per class; the fuzzers (test_fuzz_*.py) generate the rest.


def _no_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def test_calibrate_never_writes_over_its_input_or_a_special_file(crossover_run, tmp_path):
    path = crossover_run.path
    (tmp_path / "notes.txt").write_text("mine")
    fifo = _fifo(tmp_path, "fifo.json")
    before = _snapshot(path)
    assert "is an input of this command" in one_line_error("calibrate", path, "--out", path / POINTS_FILE)
    assert "is an input of this command" in one_line_error("calibrate", path, "--out", path / "meta.json")
    other = tmp_path / "other"
    other.mkdir()
    (other / "points.csv").write_text("someone else's run")
    assert "is part of the run in" in one_line_error("calibrate", path, "--out", other / "points.csv")
    assert (other / "points.csv").read_text() == "someone else's run"
    assert "is a FIFO" in one_line_error("calibrate", path, "--out", fifo)
    assert "is a device" in one_line_error("calibrate", path, "--out", "/dev/null")
    assert "not a file of that kind" in one_line_error("calibrate", path, "--out", tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine" and fifo.exists() and _snapshot(path) == before


def test_calibrate_install_checks_its_target_before_writing_anything(crossover_run, tmp_path, monkeypatch):
    path = crossover_run.path
    assert runner.invoke(app, ["calibrate", str(path), "--margin", "0.5"]).exit_code == 0
    before = _snapshot(path)
    (tmp_path / "target").mkdir()
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(tmp_path / "target"))
    assert "install target" in one_line_error("calibrate", path, "--install")
    assert _snapshot(path) == before  # the margin-0.5 file is still there


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("margin", float("nan"), "NaN is not a number a file may hold"),
        ("margin", -1, "margin must be a finite number at least 0"),
        ("baseline", "carrier-pigeon", "baseline 'carrier-pigeon' is not a name"),
        ("tables.0.ranges.0.backend", "warp", "backend 'warp' is unknown"),
        ("tables.0.ranges.0.backend", 5, "must be a string"),
        ("tables.0.ranges.1.lo", "4096", "must be a whole number"),
        ("tables.0.world_size", 1e999, "Infinity is not a number a file may hold"),
        ("tables.0.world_size", 2.5, "must be a whole number"),
        ("models.0.alpha_us", "fast", "alpha_us must be a number"),
        ("tables.0.ranges.1.lo", 10**400, "outside"),
        ("backend_setup.gloo.capacity.all_reduce", "lots", "must be a whole number"),
    ],
)
def test_malformed_thresholds_are_one_format_error_everywhere(tmp_path, field, value, needle):
    from arxtune.harness.calibrate import calibrate
    from helpers.runs import make_run

    run = make_run(
        tmp_path,
        lambda b, n: 5 + n / 1000 if b == "fast" else 50 + n / 4000,
        [1 << k for k in range(10, 16)],
        status_extra={"gloo": {"capacity": {"all_reduce": 1 << 20}}},
    )
    data = calibrate(run).to_dict()
    data["backend_setup"] = {"gloo": {"options": {}, "capacity": {"all_reduce": 1 << 20}}}
    parent, *path, last = [data, *field.split(".")]  # type: ignore[misc]
    for key in path:  # type: ignore[has-type]
        parent = parent[int(key) if key.isdigit() else key]  # type: ignore[has-type]
    parent[int(last) if last.isdigit() else last] = value  # type: ignore[has-type]
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(data))
    assert needle in one_line_error("show", target)
    thresholds, _, why = read_thresholds(2, target)  # the runtime: a reason to warn about, never an exception
    assert thresholds is None and needle in why


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100000 + "]" * 100000,
        '{"kind": "arxtune-thresholds", "version": ' + "9" * 5000 + "}",
        '{"kind": "arxtune-thresholds", "version": NaN}',
    ],
)
def test_hostile_json_is_one_line(tmp_path, text):
    target = tmp_path / "t.json"
    target.write_text(text)
    assert one_line_error("show", target).startswith("arxtune: error:")
    assert read_thresholds(2, target)[0] is None


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"backends": {"gloo": 5}}, "backends.gloo must be an object"),
        ({"config": {"step_factor": "abc"}}, "step_factor must be a number"),
        ({"config": {"step_factor": 0}}, "step_factor must be a finite number above 1"),
        ({"world_size": 1e999}, "Infinity is not a number a file may hold"),
        ({"world_size": 1e300}, "world_size must be a whole number"),
        ({"backends": {"gloo": {"available": True, "capacity": {"all_reduce": "lots"}}}}, "capacity.all_reduce must be a whole number"),
    ],
)
def test_malformed_meta_is_one_line_for_every_command(crossover_run, tmp_path, change, needle):
    path = crossover_run.path
    meta = json.loads((path / "meta.json").read_text())
    meta.update(change)
    (path / "meta.json").write_text(json.dumps(meta))
    before = _snapshot(path)
    for command in (["show", path], ["calibrate", path], ["plot", path], ["compare", path, path], ["sweep", "--resume", path]):
        assert needle in one_line_error(*command)
    assert _snapshot(path) == before


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--nproc-per-node", "0"], "--nproc-per-node 0 must be between 1"),
        (["--nproc-per-node", "-1"], "--nproc-per-node -1 must be between 1"),
        (["--run-id", "../escaped"], "must be a plain name"),
        (["--views", "graph"], "none of the views asked for (graph)"),
        (["--backends", "nccl"], "none of the backends asked for can run on this machine (nccl:"),
        (["--nnodes", "2", "--rdzv-endpoint", "host"], "must be HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank 2"),
    ],
)
def test_sweeps_that_cannot_run_are_refused_before_launching(tmp_path, monkeypatch, flags, needle):
    _no_torchrun(monkeypatch)
    assert needle in one_line_error("sweep", *flags, "--out", tmp_path)
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "escaped").exists()


def test_sweep_out_must_be_a_folder_of_runs(crossover_run, monkeypatch):
    _no_torchrun(monkeypatch)
    before = _snapshot(crossover_run.path)
    assert "is a run directory" in one_line_error("sweep", "--out", crossover_run.path)
    assert "is empty" in one_line_error("sweep", "--out", "")
    assert _snapshot(crossover_run.path) == before and [p.name for p in crossover_run.path.iterdir() if p.is_dir()] == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--margin", "nan"], "--margin must be a number from 0"),
        (["--margin", "-0.1"], "--margin must be a number from 0"),
        (["--tolerance", "-1"], "--tolerance must be a number from 0"),
        (["--min-agreement", "nan"], "--min-agreement must be a fraction"),
        (["--baseline", "unknown"], "--baseline 'unknown' was not measured"),
    ],
)
def test_compare_refuses_what_calibrate_refuses(tmp_path, args, needle):
    from helpers.runs import make_run

    crossover = lambda b, n: 5 + n / 1000 if b == "fast" else 50 + n / 4000  # noqa: E731
    a = make_run(tmp_path / "a", crossover, [1024, 2048, 4096], run_id="a")
    b = make_run(tmp_path / "b", crossover, [1024, 2048, 4096], run_id="b")
    assert needle in one_line_error("compare", a.path, b.path, *args)


def test_comparing_a_run_with_itself_is_refused(crossover_run, tmp_path):
    assert "a run agrees with itself" in one_line_error("compare", crossover_run.path, crossover_run.path)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("meta.json", POINTS_FILE):
        (copy / name).write_bytes((crossover_run.path / name).read_bytes())
    assert "a run agrees with itself" in one_line_error("compare", crossover_run.path, copy)


def test_environment_variables_with_fixed_values_refuse_others(monkeypatch):
    from arxtune.runtime import env
    from arxtune.runtime.router import open_router

    for value in ("strcit", "1"):
        monkeypatch.setenv("ARXTUNE_FINGERPRINT", value)
        with pytest.raises(ArxtuneError, match=f"ARXTUNE_FINGERPRINT='{value}' is not one of warn, strict"):
            env.FINGERPRINT.get()
        assert "ARXTUNE_FINGERPRINT" in one_line_error("doctor")
    monkeypatch.setenv("ARXTUNE_FINGERPRINT", "STRICT")
    assert env.FINGERPRINT.get() == "STRICT" and env.problems() == []
    monkeypatch.setattr("arxtune.runtime.backends.EXTRA_PROBLEMS", ["'junk' must look like name=package.module:Class"])
    with pytest.raises(ArxtuneError, match="ARXTUNE_EXTRA_BACKENDS"):
        open_router(None, None, "gloo", lambda name: True)  # the communicator's and the plugin's start-up path
    assert "ARXTUNE_EXTRA_BACKENDS" in one_line_error("doctor")


def test_symlink_loops_are_not_reported_as_missing(tmp_path):
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    for command in (["show", loop], ["calibrate", loop], ["plot", loop], ["sweep", "--config", loop]):
        line = one_line_error(*command)
        assert "symbolic links" in line and "not found" not in line


def test_plot_names_an_unknown_or_absent_view(crossover_run):
    assert "unknown view 'bogus'; known: eager, isolated, graph, decode" in one_line_error("plot", crossover_run.path, "--view", "bogus")
    assert "has no correct points in the graph view (it has: eager)" in one_line_error("plot", crossover_run.path, "--mode", "graph")


def test_flags_typer_cannot_parse_are_one_line(crossover_run):
    assert "Invalid value for '--margin'" in one_line_error("calibrate", crossover_run.path, "--margin", "abc")
    assert "No such option" in one_line_error("show", crossover_run.path, "--colour")


# Round three: nothing written before everything is known, one writer per run, and the smaller cases.


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--export", "nccl-tuner", "--tuner-mode", "bogus"], "unknown --tuner-mode 'bogus'"),
        (["--export", "nccl-tuner", "--tuner-dtype", "bogus"], "unknown --tuner-dtype 'bogus'"),
        (["--export", "nccl-tuner", "--tuner-dtype", "bfloat16"], "has no bfloat16 table"),
    ],
)
def test_calibrate_checks_every_option_before_writing_anything(crossover_run, args, needle):
    path = crossover_run.path
    assert runner.invoke(app, ["calibrate", str(path)]).exit_code == 0
    before = _snapshot(path)
    assert needle in one_line_error("calibrate", path, "--margin", "0.2", *args)
    assert _snapshot(path) == before  # the margin-0.05 file is still there, and no tuner file


def test_calibrate_install_onto_a_full_disk_changes_nothing(crossover_run, tmp_path, monkeypatch):
    path = crossover_run.path
    assert runner.invoke(app, ["calibrate", str(path)]).exit_code == 0
    before = _snapshot(path)
    full = tmp_path / "full"
    full.mkdir()
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(full / "thresholds.json"))
    real = os.fsync

    def no_space_in_full(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(full)):
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", no_space_in_full)
    assert "No space left on device" in one_line_error("calibrate", path, "--install", "--margin", "0.2")
    assert _snapshot(path) == before and list(full.iterdir()) == []


def test_calibrate_writes_every_output_or_none(crossover_run, tmp_path, monkeypatch):
    """The last rename failing puts back the files renamed before it."""
    from arxtune.runtime import fileio

    path = crossover_run.path
    assert runner.invoke(app, ["calibrate", str(path)]).exit_code == 0
    before = _snapshot(path)
    real = os.replace

    def tuner_cannot_land(src, dst):
        if str(dst).endswith("nccl-tuner.csv"):
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", tuner_cannot_land)
    assert "Input/output error" in one_line_error("calibrate", path, "--margin", "0.2", "--export", "nccl-tuner")
    assert _snapshot(path) == before
    monkeypatch.setattr(fileio.os, "replace", real)
    result = runner.invoke(app, ["calibrate", str(path), "--margin", "0.2", "--export", "nccl-tuner"])
    assert result.exit_code == 0 and "nccl tuner: " in result.output
    assert sorted(_snapshot(path)) == ["meta.json", "nccl-tuner.csv", "points.csv", "thresholds.json"]


def test_a_second_writer_of_a_run_is_refused_naming_the_first(crossover_run, tmp_path, monkeypatch):
    _no_torchrun(monkeypatch)
    path = crossover_run.path
    meta = json.loads((path / "meta.json").read_text())
    meta["finished"] = None
    (path / "meta.json").write_text(json.dumps(meta))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from arxtune.harness.results import RunWriter; "
            "w = RunWriter.resume(sys.argv[1]); print('holding', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        before = _snapshot(path)
        line = one_line_error("sweep", "--resume", path)
        assert f"run {path} is being written by pid {holder.pid} on host " in line, line
        with pytest.raises(ArxtuneError, match=f"pid {holder.pid}"):
            from arxtune.harness.results import RunWriter

            RunWriter.resume(path)
        assert _snapshot(path) == before
    finally:
        holder.kill()
        holder.wait()
    # The holder died without letting go: the next writer takes over, with a warning naming it.
    from arxtune.harness.results import RunWriter

    with pytest.MonkeyPatch.context() as patch:
        said = []
        patch.setattr("arxtune.runtime.fileio._warn", said.append)
        writer = RunWriter.resume(path)
    assert said and f"taking over from pid {holder.pid} on host " in said[0], said
    writer.close()
    assert not (path / "writer.lock").exists()


def test_run_id_of_a_finished_run_does_not_suggest_resume(crossover_run):
    from arxtune.harness.results import RunExists, RunWriter

    with pytest.raises(RunExists) as caught:
        RunWriter.create(crossover_run.path.parent, crossover_run.meta)
    assert "pick another --run-id" in str(caught.value) and "--resume" not in str(caught.value)


def test_show_of_a_file_inside_a_run_names_the_run(crossover_run):
    line = one_line_error("show", crossover_run.path / POINTS_FILE)
    assert f"is part of the run in {crossover_run.path}; show the run: arxtune show {crossover_run.path}" in line


def test_an_empty_config_is_every_default_said_once(tmp_path, caplog):
    path = tmp_path / "empty.toml"
    path.write_bytes(b"")
    from arxtune.harness.config import SweepConfig

    assert load_config(path) == SweepConfig()
    assert [r.getMessage() for r in caplog.records] == [
        f"arxtune: config {path} is empty: every setting takes its default, as with no --config"
    ]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("all_reduce:0-99999999999GiB=gloo", "is above 1048576GiB"),
        ("all_reduce:0-" + "9" * 5000 + "=gloo", "is above 1048576GiB"),
    ],
)
def test_override_bounds_above_the_format_cap_are_refused(text, needle):
    from arxtune.runtime.router import parse_overrides

    with pytest.raises(ArxtuneError, match=needle):
        parse_overrides(text)


def test_doctor_refuses_a_report_path_it_would_destroy_and_a_bad_timeout(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    assert "--report" in one_line_error("doctor", "--report", mine)
    assert mine.read_text() == "mine"
    assert "--timeout-s" in one_line_error("doctor", "--timeout-s", "0")
    assert "--timeout-s" in one_line_error("doctor", "--timeout-s", "nan")
