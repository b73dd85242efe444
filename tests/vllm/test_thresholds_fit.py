"""The plugin's start-up check of a thresholds file against a group (in-process, no ranks)."""

from __future__ import annotations

import torch

from arxtune.runtime.thresholds import Range, Table, Thresholds
from arxtune.runtime.vllm_plugin import read_thresholds


def thresholds(world: int = 2, dtype: str = "float32") -> Thresholds:
    return Thresholds("nccl", 0.05, {}, (Table("all_reduce", dtype, world, (Range(0, 4096, "arx"), Range(4096, None, "nccl"))),))


def test_reads_the_file_named_by_the_environment(tmp_path, monkeypatch):
    path = thresholds().save(tmp_path / "t.json")
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(path))
    loaded, where, why = read_thresholds(2, torch.float32)
    assert loaded == thresholds() and where == path and why == ""


def test_default_location_when_the_variable_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("ARXTUNE_THRESHOLDS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded, where, why = read_thresholds(2)
    assert loaded is None and where == tmp_path / ".config" / "arxtune" / "thresholds.json"
    assert why.startswith("no thresholds file at") and "arxtune calibrate RUN --install" in why


def test_other_world_size_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(thresholds(world=4).save(tmp_path / "t.json")))
    assert "world sizes [4], not 2" in read_thresholds(2)[2]


def test_model_dtype_must_be_covered(tmp_path, monkeypatch):
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(thresholds(dtype="float32").save(tmp_path / "t.json")))
    assert "covers float32, not the model's bfloat16" in read_thresholds(2, torch.bfloat16)[2]
    assert read_thresholds(2, None)[2] == ""  # no model config (e.g. tests): nothing to compare


def test_bad_file_is_a_reason_not_an_exception(tmp_path, monkeypatch):
    (tmp_path / "t.json").write_text("[]")
    monkeypatch.setenv("ARXTUNE_THRESHOLDS", str(tmp_path / "t.json"))
    assert "not an arxtune thresholds file" in read_thresholds(2)[2]
