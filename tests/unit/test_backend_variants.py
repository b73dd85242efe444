"""Backend variants (`nccl[proto=LL,channels=4]`): names, the registry, configs, results, thresholds and overrides."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

from arxtune.harness.calibrate import calibrate
from arxtune.harness.config import from_mapping
from arxtune.harness.results import load_run
from arxtune.runtime import backends
from arxtune.runtime.backends import GroupContext, canonical, create, problem, split_name, split_names, with_variants
from arxtune.runtime.backends.base import BackendUnavailable
from arxtune.runtime.backends.nccl import NcclBackend
from arxtune.runtime.backends.nccl_lib import CONFIG_UNDEF, CommConfig, nccl_environment
from arxtune.runtime.backends.nccl_variant import NcclVariant
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.router import parse_overrides
from arxtune.runtime.thresholds import load
from helpers.runs import make_run


def test_lists_of_names_split_on_commas_outside_brackets():
    assert split_names("gloo, nccl[proto=LL,channels=4] ,nccl[algo=Ring],") == ["gloo", "nccl[proto=LL,channels=4]", "nccl[algo=Ring]"]
    assert split_name("nccl[proto=LL, channels=4]") == ("nccl", {"proto": "LL", "channels": "4"})
    assert split_name("nccl") == ("nccl", {})
    for bad in ("nccl[proto=LL", "nccl]", "nccl[proto]", "nccl[proto=LL,proto=Simple]", "nccl[]x", "[proto=LL]"):
        with pytest.raises(ValueError):
            split_name(bad)


def test_variants_are_named_in_nccls_spelling_and_a_fixed_order():
    assert canonical("nccl[channels=4,proto=ll]") == "nccl[proto=LL,channels=4]"
    assert canonical("nccl[algo=nvls_tree]") == "nccl[algo=NVLSTree]"
    assert problem("nccl[proto=LL,channels=4]") == ""
    assert problem("nccl[channels=4,proto=LL]") == "write 'nccl[channels=4,proto=LL]' as 'nccl[proto=LL,channels=4]'"
    assert "not one of LL, LL128, Simple" in problem("nccl[proto=LL256]")
    assert "not one of Tree, Ring" in problem("nccl[algo=Spiral]")
    assert "from 1 to 64" in problem("nccl[channels=0]") and "from 1 to 64" in problem("nccl[channels=x]")
    assert "not colour" in problem("nccl[colour=red]")
    assert problem("gloo[proto=LL]") == "gloo has no variants"
    assert problem("nope[proto=LL]").startswith("unknown backend")


def test_a_variant_sets_nccls_protocol_and_algorithm_variables_and_its_channels_through_the_config():
    v = NcclVariant.parse({"proto": "ll128", "algo": "ring", "channels": "4"})
    assert v == NcclVariant("LL128", "Ring", 4)
    assert v.environment() == {"NCCL_PROTO": "LL128", "NCCL_ALGO": "Ring"}
    assert NcclVariant.parse({"channels": "8"}).environment() == {}
    config = CommConfig.with_channels(4)
    assert config.size == ctypes.sizeof(CommConfig) == (40 if ctypes.sizeof(ctypes.c_void_p) == 8 else 32)
    assert (config.magic, config.version, config.minCTAs, config.maxCTAs) == (0xCAFEBEEF, 21700, 4, 4)
    assert config.blocking == config.cgaClusterSize == CONFIG_UNDEF and config.netName is None


def test_nccl_variables_are_set_only_around_communicator_creation_and_restored_even_on_failure(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # the user's own setting
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    with nccl_environment({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}):
        assert (os.environ["NCCL_PROTO"], os.environ["NCCL_ALGO"]) == ("LL", "Ring")
    assert "NCCL_PROTO" not in os.environ and os.environ["NCCL_ALGO"] == "Tree"
    with pytest.raises(RuntimeError):
        with nccl_environment({"NCCL_PROTO": "Simple"}):
            raise RuntimeError("ncclCommInitRank failed")
    assert "NCCL_PROTO" not in os.environ


def test_the_registry_opens_a_variant_with_its_parsed_settings(monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "tagged", "helpers.backends:TaggedGloo")
    seen = {}

    def fake_init(self, ctx, variant=None):
        seen["variant"] = variant

    from helpers.backends import TaggedGloo

    monkeypatch.setattr(TaggedGloo, "__init__", fake_init)
    ctx = GroupContext(0, 1, 0, torch.device("cpu"), None)
    create("tagged[tag=a]", ctx)
    assert seen["variant"].settings() == {"tag": "a"}
    create("tagged", ctx)
    assert seen["variant"] is None
    with pytest.raises(BackendUnavailable, match="tag=WORD"):
        create("tagged[tag=a-b]", ctx)
    assert NcclBackend.parse_variant({"proto": "LL"}) == NcclVariant("LL")


def test_nccl_refuses_cpu_runs_for_its_variants_as_for_itself():
    with pytest.raises(BackendUnavailable, match="CUDA"):
        create("nccl[proto=LL]", GroupContext(0, 1, 0, torch.device("cpu"), None))


def test_the_variants_option_adds_one_backend_per_entry_after_its_base():
    config = from_mapping({"backends": "gloo,nccl", "backend_options": {"nccl": {"variants": ["proto=LL", "channels=4,algo=ring"]}}})
    assert config.backends == ("gloo", "nccl")
    assert config.timed_backends() == ("gloo", "nccl", "nccl[proto=LL]", "nccl[algo=Ring,channels=4]")
    assert config.to_dict()["backend_options"] == {"nccl": {"variants": ["proto=LL", "channels=4,algo=ring"]}}  # what the run records
    direct = from_mapping({"backends": ["gloo", "nccl[proto=Simple,channels=2]"], "baseline": "nccl[proto=Simple,channels=2]"})
    assert direct.timed_backends() == ("gloo", "nccl[proto=Simple,channels=2]")
    assert with_variants(("gloo",), {"nccl": {"variants": ["proto=LL"]}}) == ("gloo",)  # options of a backend not swept


@pytest.mark.parametrize(
    "mapping, needle",
    [
        ({"backends": "nccl", "backend_options": {"nccl": {"variants": ["proto=LL9"]}}}, "proto=LL9 is not one of"),
        ({"backends": "nccl", "backend_options": {"nccl": {"variants": "proto=LL"}}}, "must be a list of strings"),
        ({"backends": "nccl", "backend_options": {"nccl": {"variants": ["proto=LL", "proto=ll"]}}}, "named twice"),
        ({"backends": "nccl,nccl[proto=LL]", "backend_options": {"nccl": {"variants": ["proto=LL"]}}}, "named twice"),
        ({"backends": "gloo", "backend_options": {"gloo": {"variants": ["proto=LL"]}}}, "gloo has no variants"),
        ({"backends": "gloo,nccl[channels=2,proto=LL]"}, "as 'nccl[proto=LL,channels=2]'"),
        ({"backends": "gloo", "baseline": "nccl[proto=XX]"}, "unknown baseline"),
    ],
)
def test_bad_variants_in_a_config_are_one_line(mapping, needle):
    with pytest.raises(ArxtuneError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        from_mapping(mapping)


def test_overrides_can_name_variants_whose_settings_hold_commas():
    found = parse_overrides("all_reduce:0-64KiB=nccl[proto=LL,channels=4]; all_reduce:64KiB-=nccl[algo=Ring],all_gather:0-=arx")
    assert [(o.op, o.lo, o.hi, o.backend) for o in found] == [
        ("all_reduce", 0, 65536, "nccl[proto=LL,channels=4]"),
        ("all_reduce", 65536, None, "nccl[algo=Ring]"),
        ("all_gather", 0, None, "arx"),
    ]


VARIANTS = ("nccl", "nccl[proto=LL,channels=4]", "nccl[proto=Simple,algo=Ring]")


def test_variant_names_survive_points_csv_and_the_thresholds_file(tmp_path):
    def latency(backend, nbytes):
        return {"nccl": 30 + nbytes / 1e4, "nccl[proto=LL,channels=4]": 5 + nbytes / 2e3}.get(backend, 60 + nbytes / 2e4)

    run = make_run(
        tmp_path,
        latency,
        [1 << k for k in range(10, 25)],
        backends=VARIANTS,
        status_extra={"nccl[proto=LL,channels=4]": {"options": {"variant": {"proto": "LL", "channels": "4"}}}},
    )
    again = load_run(run.path)
    assert {r.backend for r in again.records} == set(VARIANTS)
    saved = calibrate(again, baseline="nccl").save(tmp_path / "t.json")
    loaded = load(saved)
    assert loaded.baseline == "nccl"
    assert '"nccl[proto=LL,channels=4]",all_reduce' in (run.path / "points.csv").read_text()  # quoted: its comma is kept
    measured = [r.backend for r in loaded.tables[0].ranges if r.source == "measured"]
    assert measured == ["nccl[proto=LL,channels=4]", "nccl", "nccl[proto=Simple,algo=Ring]"]
    assert loaded.backend_setup["nccl[proto=LL,channels=4]"].options == {"variant": {"proto": "LL", "channels": "4"}}
