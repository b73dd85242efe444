import json

import pytest
from typer.testing import CliRunner

from arxtune.cli import app
from arxtune.runtime.thresholds import load

runner = CliRunner()


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def _one_line_error(result):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("arxtune: error:"), result.output
    return lines[0]


def test_calibrate_show_and_plot(crossover_run, tmp_path, monkeypatch):
    result = invoke("calibrate", crossover_run.path, "--export", "csv")
    assert result.exit_code == 0, result.output
    assert "collective,min_bytes" in result.output
    thresholds_path = crossover_run.path / "thresholds.json"
    assert load(thresholds_path).tables

    result = invoke("show", thresholds_path)
    assert result.exit_code == 0 and "fast" in result.output and "measured" in result.output
    result = invoke("show", crossover_run.path)
    assert result.exit_code == 0 and "all_reduce" in result.output

    result = invoke("plot", crossover_run.path)
    assert result.exit_code == 0, result.output
    png = crossover_run.path / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = invoke("plot", crossover_run.path, "--out", tmp_path / "p.svg")
    assert result.exit_code == 0 and (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")


def test_calibrate_install_writes_where_deployments_look(crossover_run, tmp_path, monkeypatch):
    target = tmp_path / "deploy" / "thresholds.json"
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(target))
    result = invoke("calibrate", crossover_run.path, "--install", "--margin", "0.1")
    assert result.exit_code == 0, result.output
    assert load(target).margin == pytest.approx(0.1)


def test_calibrate_merges_several_runs_into_one_file(tmp_path):
    from helpers.runs import make_run

    latency = lambda b, n: 5 + n / 1000 if b == "fast" else 20.0  # noqa: E731
    sizes = [1 << k for k in range(10, 16)]
    w2 = make_run(tmp_path, latency, sizes, world=2, run_id="w2")
    again = make_run(tmp_path, latency, sizes, world=2, run_id="again")
    w3 = make_run(tmp_path, latency, sizes, world=3, run_id="w3")
    assert "--out FILE" in _one_line_error(invoke("calibrate", w2.path, w3.path))
    result = invoke("calibrate", w2.path, w3.path, "--out", tmp_path / "t.json", "--export", "table")
    assert result.exit_code == 0, result.output
    assert load(tmp_path / "t.json").world_sizes == {2, 3} and "thresholds from runs w2, w3" in result.output
    assert "pass --prefer RUN" in _one_line_error(invoke("calibrate", w2.path, again.path, "--out", tmp_path / "u.json"))
    result = invoke("calibrate", w2.path, again.path, "--out", tmp_path / "u.json", "--prefer", again.path)
    assert result.exit_code == 0, result.output
    assert [r.run_id for r in load(tmp_path / "u.json").runs] == ["again"]


def test_missing_run(tmp_path):
    assert "not an arxtune run" in _one_line_error(invoke("calibrate", tmp_path / "nope"))


def test_bad_thresholds_file(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"kind": "arxtune-thresholds", "version": 0}))
    assert "version 0" in _one_line_error(invoke("show", bad))


def test_bad_plot_format(crossover_run, tmp_path):
    assert ".jpg" in _one_line_error(invoke("plot", crossover_run.path, "--out", tmp_path / "p.jpg"))


def test_bad_config_fails_before_launching(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    config = tmp_path / "c.toml"
    config.write_text("[sweep]\nops = ['all_to_all']\n")
    assert "unknown op" in _one_line_error(invoke("sweep", "--config", config))
    assert "unknown dtype" in _one_line_error(invoke("sweep", "--dtypes", "float8"))
    assert "--rdzv-endpoint" in _one_line_error(invoke("sweep", "--nnodes", "2"))
    assert "not an arxtune run" in _one_line_error(invoke("sweep", "--resume", tmp_path))


def test_help_has_examples():
    result = invoke("sweep", "--help")
    assert result.exit_code == 0 and "torchrun" in result.output


def test_modes_is_the_old_name_of_views():
    """--modes still reaches the same check as --views; the two together are refused."""
    assert "unknown view(s) bogus" in _one_line_error(invoke("sweep", "--modes", "bogus"))
    assert "unknown view(s) bogus" in _one_line_error(invoke("sweep", "--views", "bogus"))
    assert "old name of --views" in _one_line_error(invoke("sweep", "--views", "eager", "--modes", "eager"))
