"""vLLM's own plugin loader finds arxtune's entry point and honours VLLM_PLUGINS / ARXTUNE_VLLM_DISABLE.

Each case is a fresh process (vLLM loads plugins once per process); they run
side by side to keep the tier short.
"""

from __future__ import annotations

import json

import pytest

from vllm_tier import run_python, vllm_env

PROBE = r"""
import json
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

load_general_plugins()
name = current_platform.get_device_communicator_cls()
cls = resolve_obj_by_qualname(name)
report = {"name": name, "cls": cls.__name__, "subclass": issubclass(cls, CpuCommunicator)}
if name.startswith("arxtune"):
    import arxtune.runtime.vllm_plugin as plugin
    plugin.register()  # vLLM may load plugins again in one process: nothing may change
    report["again"] = current_platform.get_device_communicator_cls()
    report["same_class"] = resolve_obj_by_qualname(report["again"]) is cls
print("PROBE " + json.dumps(report))
"""

CASES = {
    "default": {},
    "named": {"VLLM_PLUGINS": "arxtune"},
    "other_plugin_named": {"VLLM_PLUGINS": "someone_else"},
    "disabled": {"ARXTUNE_VLLM_DISABLE": "1"},
}


@pytest.fixture(scope="module")
def probes():
    procs = {label: run_python(PROBE, vllm_env(**extra)) for label, extra in CASES.items()}
    results = {}
    for label, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("PROBE ")]
        assert proc.returncode == 0 and lines, f"{label}: exit {proc.returncode}\n{out[-4000:]}"
        results[label] = json.loads(lines[-1][len("PROBE ") :])
        results[label]["output"] = out
    return results


@pytest.mark.parametrize("label", ["default", "named"])
def test_vllm_loader_installs_the_wrapper(probes, label):
    probe = probes[label]
    assert probe["name"] == "arxtune.runtime.vllm_plugin.ArxtuneDeviceCommunicator"
    assert probe["cls"] == "ArxtuneCpuCommunicator" and probe["subclass"]
    assert probe["again"] == probe["name"] and probe["same_class"]


@pytest.mark.parametrize("label", ["other_plugin_named", "disabled"])
def test_plugin_left_out_keeps_vllms_communicator(probes, label):
    probe = probes[label]
    assert probe["name"] == "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"
    assert probe["cls"] == "CpuCommunicator"
