"""What only a backend knows is asked of its class: doctor, config checks, the start-up ladder and the plugin's
own-path test name no backend. A site backend declaring the facts is seen everywhere without other edits."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from arxtune.runtime import backends
from arxtune.runtime.errors import ArxtuneError


class Pigeon:
    name = "pigeon"
    capturable = False
    framework = "coop"
    start_up_candidate = ("cpu",)

    @classmethod
    def why_not_here(cls) -> str | None:
        return "no pigeons on this box"

    @staticmethod
    def check_options(options: dict) -> None:
        if set(options) - {"birds"}:
            raise ArxtuneError("unknown option; known: birds")


@pytest.fixture
def pigeon(monkeypatch):
    module = types.ModuleType("pigeon_site")
    module.Pigeon = Pigeon  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pigeon_site", module)
    monkeypatch.setitem(backends.REGISTRY, "pigeon", "pigeon_site:Pigeon")
    return "pigeon"


def test_doctor_asks_each_class_why_it_cannot_run(pigeon):
    from arxtune.harness.doctor import backend_reasons

    reasons = backend_reasons()
    assert reasons["pigeon"] == "no pigeons on this box"
    assert set(backends.BUILTIN) <= set(reasons)  # every built-in can tell without a group
    assert reasons["gloo"] is None  # this box has torch's gloo


def test_config_asks_the_class_to_check_its_options(pigeon):
    from arxtune.harness.config import from_mapping

    from_mapping({"backends": ["gloo"], "backend_options": {"pigeon": {"birds": 3}}})
    with pytest.raises(ArxtuneError, match="backend_options.pigeon: unknown option; known: birds"):
        from_mapping({"backends": ["gloo"], "backend_options": {"pigeon": {"cats": 1}}})
    with pytest.raises(ArxtuneError, match="backend_options.symm_mem: unknown option 'x'"):
        from_mapping({"backends": ["gloo"], "backend_options": {"symm_mem": {"x": 1}}})


def test_start_up_candidates_and_frameworks_come_from_the_classes(pigeon):
    from arxtune.runtime import ladder

    def mine(found: tuple[str, ...]) -> list[str]:  # other tests register site backends of their own
        return [n for n in found if n in backends.BUILTIN or n == "pigeon"]

    assert mine(backends.start_up_candidates("cpu")) == ["vllm_cpu", "pigeon"]
    assert mine(ladder.candidates(torch.device("cuda"))) == ["symm_mem", "vllm_custom_ar", "pigeon"]  # site backends: every device
    assert backends.framework("pigeon") == "coop" and backends.framework("vllm_custom_ar") == "vllm"
    assert backends.framework("nccl[proto=LL]") == "" and backends.framework("nosuch") == ""
