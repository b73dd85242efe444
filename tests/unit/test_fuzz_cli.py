"""Every command's arguments, generated: the promise holds whatever the user types.

An invocation either succeeds, or fails with exactly one line `arxtune: error: ...` on stderr, a
non-zero exit and no traceback; either way within a time bound, and every file that existed before
is byte-identical afterwards unless it is an output the command was asked to write (and never a
run's data). `sweep` never launches ranks here: the launcher is replaced by one that records the
plan, so what is fuzzed is everything checked before launching.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from arxtune.cli import app
from arxtune.harness import launch
from arxtune.harness.results import META_FILE, POINTS_FILE

from helpers.runs import make_run

EXAMPLE_S = 20.0
#: Lines a command prints as it goes, before any error (e2e names each engine it starts).
PROGRESS = ("e2e: ",)
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
runner = CliRunner()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two runs, a thresholds file, a FIFO, a file that is not ours and a directory, made once for every example."""
    root = tmp_path_factory.mktemp("lab")
    latency = lambda b, n: 5 + n / 1000 if b == "fast" else 50 + n / 4000  # noqa: E731
    sizes = [1 << k for k in range(10, 15)]
    run_a = make_run(root, latency, sizes, run_id="a", n=20)
    make_run(root, latency, sizes, run_id="b", n=20, spread=0.05)
    result = runner.invoke(app, ["calibrate", str(run_a.path)])
    assert result.exit_code == 0, result.output
    os.mkfifo(root / "fifo")
    (root / "notes.txt").write_text("not arxtune's")
    (root / "dir").mkdir()
    (root / "full").mkdir()  # a folder on a "full disk": every write there fails (see _full_disk)
    return root


@pytest.fixture(autouse=True)
def _full_disk(lab, monkeypatch):
    """Writes under lab/full fail as on a full filesystem: after the checks, at the write itself."""
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(lab / "full")):
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.fixture(autouse=True)
def _inside_the_lab(lab, monkeypatch):
    """Relative paths the fuzzer makes up ('abc', '../x') land inside the lab, never in the checkout or beside it."""
    (lab / "cwd").mkdir(exist_ok=True)
    monkeypatch.chdir(lab / "cwd")


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _paths(lab: Path) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            str(lab / "a"),
            str(lab / "b"),
            str(lab / "a" / POINTS_FILE),
            str(lab / "a" / META_FILE),
            str(lab / "a" / "thresholds.json"),
            str(lab / "fifo"),
            str(lab / "notes.txt"),
            str(lab / "dir"),
            str(lab / "missing" / "x.json"),
            str(lab),
            "",
            ".",
            "/dev/null",
            "/dev/zero",
            "/proc/x/y.json",
            "../escaped",
            "a\x00b",
            "x" * 5000,
            str(lab / "new.json"),
            str(lab / "new.svg"),
            str(lab / "full" / "x.json"),
            str(lab / "full" / "x.csv"),
            str(lab / "notes.txt" / "x.json"),
        ]
    )


VALUES = st.one_of(
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "-1",
            "0",
            "1e999",
            "9" * 400,
            "abc",
            "",
            "0.5",
            "2",
            "1KiB",
            "-5MiB",
            "gloo",
            "fast",
            "nccl",
            "eager",
            "graph",
            "isolated",
            "bogus",
            "csv",
            "table",
            "xml",
            "nccl-tuner",
            "float32",
            "bfloat16",
            "int32",
            "eager,graph",
            "gloo,,",
            "host",
            "host:0",
            "host:99999",
            "h:1",
            "../x",
            "\x00",
        ]
    ),
    st.text(max_size=6),
)


def _check(result, before: dict[Path, bytes], after: dict[Path, bytes], outputs: set[Path], started: float) -> None:
    assert time.monotonic() - started < EXAMPLE_S
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith(PROGRESS)]
        assert len(lines) == 1 and lines[0].startswith("arxtune: error: "), result.output
        assert after == {p: b for p, b in before.items() if p in after} and set(before) <= set(after), "a failed command changed files"
    for path, data in before.items():
        if path.name in (META_FILE, POINTS_FILE) or path not in outputs:
            assert after.get(path) == data, f"{path} changed"


def _invoke(lab: Path, args: list[str], outputs: set[Path]) -> None:
    before, started = _snapshot(lab), time.monotonic()
    result = runner.invoke(app, args)
    after = _snapshot(lab)
    _check(result, before, after, outputs, started)
    for path in set(after) - set(before):  # what a successful command wrote goes, so the next example starts alike
        path.unlink()


def _outputs(lab: Path, args: list[str], defaults: tuple[Path, ...]) -> set[Path]:
    """Files this invocation may legitimately write: the --out it names, and the command's defaults."""
    named = {Path(args[i + 1]) for i, a in enumerate(args[:-1]) if a in ("--out", "--tuner-out")}
    return {p.resolve() if p.is_absolute() else p for p in named} | set(defaults)


#: Values each option takes when used as meant: a command whose every value is plausible gets past the early
#: checks, so what it refuses late (a tuner mode the file lacks, a disk that fills) is reached too.
PLAUSIBLE = {
    "--margin": ["0.2", "0.05"],
    "--export": ["nccl-tuner", "csv", "table"],
    "--tuner-mode": ["eager", "graph"],
    "--tuner-dtype": ["float32", "bfloat16"],
    "--eager-from": ["eager", "isolated"],
    "--graph-from": ["graph"],
    "--baseline": ["gloo", "fast"],
    "--tolerance": ["0.05"],
    "--min-agreement": ["0.5"],
    "--view": ["eager"],
}

OPTIONS = {
    "calibrate": [
        "--out",
        "--baseline",
        "--margin",
        "--eager-from",
        "--graph-from",
        "--prefer",
        "--export",
        "--tuner-out",
        "--tuner-mode",
        "--tuner-dtype",
    ],
    "compare": ["--baseline", "--margin", "--tolerance", "--min-agreement"],
    "plot": ["--thresholds", "--out", "--view", "--mode"],
    "show": [],
}


@FUZZ
@given(data=st.data(), command=st.sampled_from(sorted(OPTIONS)))
def test_commands_on_runs_and_files(lab, monkeypatch, data, command):
    """calibrate's option space includes --export nccl-tuner and its options, and install targets that fail
    (a folder, a FIFO, a file of another kind, a path through a file, a full disk): a refused command leaves
    every earlier file byte for byte (_check)."""
    install = data.draw(
        st.sampled_from(
            [
                lab / "installed.json",
                lab / "installed.json",
                lab / "dir",
                lab / "fifo",
                lab / "notes.txt",
                lab / "notes.txt" / "t.json",
                lab / "full" / "thresholds.json",
            ]
        )
    )
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(install))
    paths = _paths(lab)
    runs = st.one_of(st.just(str(lab / "a")), st.just(str(lab / "b")), paths)  # two in three reach the command itself
    positional = [data.draw(runs)] + ([data.draw(runs)] if command == "compare" else [])
    args = [command, *positional]
    for option in data.draw(st.lists(st.sampled_from(OPTIONS[command]), max_size=3, unique=True)) if OPTIONS[command] else []:
        plausible = st.sampled_from(PLAUSIBLE.get(option, ["x"]))
        args += [option, data.draw(st.one_of(plausible, plausible, plausible, paths, VALUES))]
    if command == "calibrate" and data.draw(st.booleans()):
        args.append("--install")
    if command == "calibrate" and "--export" not in args and data.draw(st.booleans()):
        args += ["--export", "nccl-tuner"]  # so the tuner's options meet the export they belong to
    defaults = (
        lab / "a" / "thresholds.json",
        lab / "b" / "thresholds.json",
        lab / "a" / "plot.png",
        lab / "b" / "plot.png",
        lab / "installed.json",
        lab / "a" / "nccl-tuner.csv",
        lab / "b" / "nccl-tuner.csv",
    )
    _invoke(lab, args, _outputs(lab, args, defaults))


CALIBRATE_TARGETS = ("installed.json", "dir", "fifo", "notes.txt", "notes.txt/t.json", "full/thresholds.json")


@FUZZ
@given(data=st.data())
def test_calibrate_option_space(lab, monkeypatch, data):
    """calibrate alone, its options mostly as meant, --export nccl-tuner and --install often, install targets that
    are refused up front (a folder, a FIFO, another kind of file, a path through a file) or fail at the write (a
    full disk): it writes every output or none, and a refused command leaves every earlier file byte for byte."""
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(lab / data.draw(st.sampled_from(CALIBRATE_TARGETS))))
    args = ["calibrate", data.draw(st.sampled_from([str(lab / "a"), str(lab / "b")]))]
    if data.draw(st.booleans()):
        args += ["--export", "nccl-tuner"]
    if data.draw(st.booleans()):
        args.append("--install")
    options = [o for o in OPTIONS["calibrate"] if o != "--export" or "--export" not in args]
    for option in data.draw(st.lists(st.sampled_from(options), max_size=3, unique=True)):
        plausible = st.sampled_from(PLAUSIBLE.get(option, [str(lab / "full" / "x.csv"), str(lab / "new.json")]))
        args += [option, data.draw(st.one_of(plausible, plausible, plausible, _paths(lab), VALUES))]
    defaults = (
        lab / "a" / "thresholds.json",
        lab / "b" / "thresholds.json",
        lab / "installed.json",
        lab / "a" / "nccl-tuner.csv",
        lab / "b" / "nccl-tuner.csv",
    )
    _invoke(lab, args, _outputs(lab, args, defaults))


SWEEP_OPTIONS = [
    "--backends",
    "--ops",
    "--dtypes",
    "--views",
    "--modes",
    "--min-bytes",
    "--max-bytes",
    "--step-factor",
    "--point-budget-s",
    "--out",
    "--nproc-per-node",
    "--nnodes",
    "--node-rank",
    "--rdzv-endpoint",
    "--run-id",
    "--config",
    "--resume",
]


@FUZZ
@given(data=st.data())
def test_sweep_arguments_before_launching(lab, monkeypatch, data):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    launched = []
    monkeypatch.setattr(launch, "run_under_torchrun", lambda plan, args: launched.append(plan) or launch.LaunchResult(code=0))  # type: ignore[func-returns-value]
    paths = _paths(lab)
    args = ["sweep"]
    for option in data.draw(st.lists(st.sampled_from(SWEEP_OPTIONS), min_size=1, max_size=3, unique=True)):
        args += [option, data.draw(st.one_of(paths, VALUES))]
    _invoke(lab, args, set())
    for plan in launched:  # what did reach the launcher is a plan torchrun can run
        plan.check()
        assert plan.resolved_nproc() >= 1


E2E_OPTIONS = [
    "--thresholds",
    "--force",
    "--model",
    "--tp",
    "--dtype",
    "--max-model-len",
    "--prompts",
    "--prompt-tokens",
    "--decode-tokens",
    "--rounds",
    "--repeats",
    "--out",
    "--run-id",
    "--timeout-s",
    "--nnodes",
    "--node-rank",
    "--master-port",
]


@FUZZ
@given(data=st.data())
def test_e2e_arguments_before_any_engine(lab, monkeypatch, data):
    """No engine starts here (no vLLM): everything e2e checks before its first engine is what is fuzzed."""
    from arxtune.harness import e2e

    def no_engine(*_):
        raise e2e.ArxtuneError("no engine in this test")

    monkeypatch.setattr(e2e, "run_engine", no_engine)
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(lab / "a" / "thresholds.json"))
    paths = _paths(lab)
    args = ["e2e", "--out", str(lab / "e2e-out")]
    for option in data.draw(st.lists(st.sampled_from(E2E_OPTIONS), min_size=1, max_size=3, unique=True)):
        args += [option, data.draw(st.one_of(paths, VALUES))]
    if data.draw(st.booleans()):
        args.append("--no-thresholds")
    _invoke(lab, args, set())


@FUZZ
@given(
    variable=st.sampled_from(
        [
            "ARXTUNE_FINGERPRINT",
            "ARXTUNE_EXTRA_BACKENDS",
            "ARXTUNE_NCCL_LOOP",
            "ARXTUNE_ARXG_NATIVE",
            "ARXTUNE_RDMA_MAX_BYTES",
            "ARXTUNE_RDMA_PORT",
            "ARXTUNE_DEVICE",
        ]
    ),
    value=VALUES,
)
def test_doctor_and_show_under_any_environment(lab, monkeypatch, variable, value):
    if "\x00" in value:
        value = value.replace("\x00", "")  # no environment variable holds a NUL
    monkeypatch.setenv(variable, value)
    if variable == "ARXTUNE_EXTRA_BACKENDS":  # read at import; what the import would have found
        from arxtune.runtime import backends

        monkeypatch.setattr(backends, "EXTRA_PROBLEMS", backends.parse_extra(value)[1])
    _invoke(lab, ["doctor"], set())
    _invoke(lab, ["show", str(lab / "a" / "thresholds.json")], set())
