from pathlib import Path

import pytest

from arxtune.harness.config import SweepConfig, format_bytes, load_config, parse_bytes
from arxtune.runtime.errors import ArxtuneError

CONFIGS = sorted(Path(__file__).parents[2].joinpath("configs", "sweep").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    assert isinstance(load_config(path), SweepConfig)


def test_configs_exist():
    assert {"cpu-smoke.toml", "gb10-2node.toml"} <= {p.name for p in CONFIGS}


def test_sizes_with_units():
    assert parse_bytes("64KiB") == 65536
    assert parse_bytes("16M") == 16 << 20
    assert parse_bytes(4096) == 4096
    with pytest.raises(ArxtuneError):
        parse_bytes("lots")
    assert format_bytes(65536) == "64KiB" and format_bytes(1536) == "1.5KiB" and format_bytes(100) == "100B"


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[sweep]\nbackends = ["gloo"]\nmax_bytes = "1MiB"\n')
    config = load_config(path).with_overrides(max_bytes="64KiB", dtypes="float16,int32", ops=None)
    assert config.max_bytes == 65536 and config.dtypes == ("float16", "int32") and config.backends == ("gloo",)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("[sweep]\nbackendz = ['gloo']\n", "unknown config key"),
        ("[sweep]\nbackends = ['carrier-pigeon']\n", "unknown backend"),
        ("[sweep]\ndtypes = ['float64']\n", "unknown dtype"),
        ("[sweep]\nmin_bytes = '2MiB'\nmax_bytes = '1MiB'\n", "min_bytes"),
        ("[sweep]\nstep_factor = 1\n", "step_factor"),
        ("[sweep\n", "not valid TOML"),
        ("[sweep]\nstep_factor = 'two'\n", "bad config value"),
    ],
)
def test_bad_configs_say_what_is_wrong(tmp_path, body, needle):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ArxtuneError, match=needle):
        load_config(path)


def test_missing_config(tmp_path):
    with pytest.raises(ArxtuneError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_the_old_modes_key_is_read_as_views(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('[sweep]\nmodes = ["eager"]\n')
    assert load_config(path).views == ("eager",)
    path.write_text('[sweep]\nmodes = ["eager"]\nviews = ["graph"]\n')
    with pytest.raises(ArxtuneError, match="old name of views"):
        load_config(path)
