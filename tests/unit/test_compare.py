import pytest
from typer.testing import CliRunner

from arxtune.cli import app
from arxtune.harness.compare import compare_runs
from arxtune.runtime.errors import ArxtuneError

from helpers.runs import make_run

SIZES = [1 << k for k in range(10, 16)]


def _crossover(at):
    """'fast' beats gloo by 2x below `at`, loses by 2x from `at` on."""
    return lambda b, n: 100.0 if b == "gloo" else (50.0 if n < at else 200.0)


def test_identical_runs_agree_everywhere(tmp_path):
    a = make_run(tmp_path / "a", _crossover(8192), SIZES, run_id="a")
    b = make_run(tmp_path / "b", _crossover(8192), SIZES, run_id="b")
    result = compare_runs(a, b)
    assert result.agreement == 1.0 and result.same_choice == len(SIZES)
    assert max(result.regrets()) == pytest.approx(0.0)


def test_a_moved_crossover_disagrees_with_its_regret(tmp_path):
    a = make_run(tmp_path / "a", _crossover(8192), SIZES, run_id="a")
    b = make_run(tmp_path / "b", _crossover(32768), SIZES, run_id="b")
    result = compare_runs(a, b)
    wrong = [p for p in result.points if not p.agree]
    assert [p.nbytes for p in wrong] == [8192, 16384]
    # A chose gloo (100 us) where B measured fast at 50 us: 100% regret.
    assert all(p.choice_a == "gloo" and p.choice_b == "fast" and p.regret_a == pytest.approx(1.0, abs=0.05) for p in wrong)
    assert result.agreement == pytest.approx(4 / 6)


def test_different_choices_within_tolerance_agree(tmp_path):
    a = make_run(tmp_path / "a", lambda b, n: 100.0 if b == "gloo" else 96.0, SIZES, run_id="a", spread=0.001)
    b = make_run(tmp_path / "b", lambda b, n: 100.0 if b == "gloo" else 96.0, SIZES, run_id="b", spread=0.001)
    result = compare_runs(a, b, margin=0.01)  # both choose fast
    assert result.same_choice == len(SIZES)
    result = compare_runs(a, b, margin=0.0, tolerance=0.05)
    assert result.agreement == 1.0


def test_runs_with_nothing_in_common_are_an_error(tmp_path):
    a = make_run(tmp_path / "a", _crossover(8192), [1024, 2048], run_id="a")
    b = make_run(tmp_path / "b", _crossover(8192), [4096, 8192], run_id="b")
    with pytest.raises(ArxtuneError, match="share no correct points"):
        compare_runs(a, b)


def test_cli_exits_non_zero_below_the_agreement_asked_for(tmp_path):
    a = make_run(tmp_path / "a", _crossover(8192), SIZES, run_id="a")
    b = make_run(tmp_path / "b", _crossover(32768), SIZES, run_id="b")
    runner = CliRunner()
    ok = runner.invoke(app, ["compare", str(a.path), str(b.path), "--min-agreement", "0.6"])
    assert ok.exit_code == 0, ok.output
    assert "6 points: agreement 66.7%" in ok.output
    low = runner.invoke(app, ["compare", str(a.path), str(b.path), "--min-agreement", "0.95"])
    assert low.exit_code == 1
    missing = runner.invoke(app, ["compare", str(a.path), str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not an arxtune run" in missing.output


def test_a_tie_costs_no_regret_but_its_raw_regret_shows_the_noise(tmp_path):
    # Two backends of the same speed, with wide noise and few samples (the same seeds each run, so it is deterministic):
    # both runs keep the baseline; the medians differ by chance, which only the raw regret shows.
    tie = lambda b, n: 100.0  # noqa: E731
    a = make_run(tmp_path / "a", tie, SIZES, run_id="a", spread=0.2, n=50)
    b = make_run(tmp_path / "b", tie, SIZES, run_id="b", spread=0.2, n=50)
    result = compare_runs(a, b)
    assert result.agreement == 1.0 and max(result.regrets()) == 0.0
    assert max(result.regrets(raw=True)) > 0.01
    assert "raw, against the other's fastest median" in result.summary()


def test_regret_is_against_the_other_runs_choice_and_never_below_zero():
    from arxtune.harness.compare import regret

    assert regret({"gloo": 100.0, "fast": 50.0}, "gloo", "fast") == (1.0, 1.0)
    assert regret({"gloo": 100.0, "fast": 50.0}, "fast", "gloo") == (0.0, 0.0)
    assert regret({"gloo": 100.0, "fast": 50.0, "x": 40.0}, "gloo", "gloo") == (0.0, 1.5)
