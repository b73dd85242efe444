"""Code that only a GPU runs (tests/gpu, benchmarks/) checked without one, so a rename does not rot it unseen.

For every such file: it parses; every name it imports from arxtune (or the tests' helpers) exists; every
attribute it reads from an imported arxtune module exists; and every attribute it reads from a loop
variable over a run's `records` (or a thresholds file's `tables`) is a field of those records. Cheap
(no GPU, no torch.cuda), and what would have caught `PointRecord.mode` after the view rename.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("tests/gpu/*.py"), *ROOT.glob("benchmarks/*.py"), ROOT / "tests/helpers/ladder_gpu_worker.py"])
OURS = ("arxtune", "helpers")


def _record_fields() -> dict[str, set[str]]:
    """Iterable attribute name -> what its items have (dataclass fields, properties, methods)."""
    from dataclasses import fields

    from arxtune.harness.results import PointRecord
    from arxtune.runtime.thresholds import Table

    return {name: set(dir(cls)) | {f.name for f in fields(cls)} for name, cls in (("records", PointRecord), ("tables", Table))}


def _module(name: str):
    return importlib.import_module(name)


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS and not node.level:
            module = _module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        sub = _module(f"{node.module}.{alias.name}")
                    except ImportError:
                        found.append(f"line {node.lineno}: {node.module} has no {alias.name}")
                        continue
                    aliases[alias.asname or alias.name] = sub
                elif isinstance(getattr(module, alias.name), type(ast)):
                    aliases[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    module = _module(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = module
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if not hasattr(aliases[node.value.id], node.attr):
                found.append(f"line {node.lineno}: {node.value.id} ({aliases[node.value.id].__name__}) has no {node.attr}")
    fields = _record_fields()
    for node in ast.walk(tree):
        loops = (
            node.generators
            if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp))
            else ([node] if isinstance(node, ast.For) else [])
        )
        for loop in loops:
            it = loop.iter
            if isinstance(it, ast.Attribute) and it.attr in fields and isinstance(loop.target, ast.Name):
                var, known = loop.target.id, fields[it.attr]
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == var and sub.attr not in known:
                        found.append(f"line {sub.lineno}: an item of .{it.attr} has no {sub.attr}")
    return found


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_code_only_a_gpu_runs_names_what_exists(path):
    assert _problems(path) == []


def test_the_check_finds_a_renamed_record_field_and_a_missing_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from arxtune.runtime.timing import CudaGraphTimer, NoSuchTimer\n"
        "from arxtune.runtime import timing\n"
        "timing.make_timer\ntiming.gone\n"
        "def f(run):\n    return {r.mode for r in run.records}\n"
    )
    assert _problems(bad) == [
        "line 1: arxtune.runtime.timing has no NoSuchTimer",
        "line 4: timing (arxtune.runtime.timing) has no gone",
        "line 6: an item of .records has no mode",
    ]
