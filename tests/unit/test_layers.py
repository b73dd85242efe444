"""The runtime (what a vLLM worker imports) never reaches into the harness, pandas or matplotlib,
and inside the runtime no import runs up a floor (FLOORS; docs/runtime.md, "Floors").

Checked twice: statically, every import statement of every runtime module (at
any depth, so lazy imports count too); and by importing each runtime module in
a fresh interpreter and looking at what it pulled in.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import arxtune

PACKAGE = Path(arxtune.__file__).parent
RUNTIME = PACKAGE / "runtime"
#: What the serving process must never import: the measuring side, its heavy libraries, the CLI.
FORBIDDEN = ("arxtune.harness", "arxtune.cli", "pandas", "matplotlib", "typer", "rich")


#: The runtime's floors, lowest first: a module imports only from its own floor or those below. Every runtime
#: module has one (a package's name covers its submodules; the longest prefix wins).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "env", "units", "schema", "fileio", "native"),  # ground: no torch.distributed, no file formats
    ("ops", "thresholds", "fingerprint", "group", "faster", "timing", "cudadrv", "rdma", "runs"),  # facts, formats, agreements
    ("rounds",),  # the one measuring engine, which the ladder and the sweep drive
    ("backends",),  # one file per backend, the registry, opening them on a group
    ("router", "ladder", "nccl_tuner"),  # what serves which call, and the start-up check of it
    ("dispatch",),  # the one path both callers take
    ("communicator", "vllm_plugin"),  # the callers
)


def floor_of(module: str) -> int:
    """The floor of `arxtune.runtime.X...` by its longest listed prefix; KeyError for a module no floor lists."""
    rest = module.removeprefix("arxtune.runtime.")
    best = max(
        ((len(name), level) for level, names in enumerate(FLOORS) for name in names if rest == name or rest.startswith(name + ".")),
        default=None,
    )
    if best is None:
        raise KeyError(module)
    return best[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _runtime_modules() -> list[Path]:
    return sorted(RUNTIME.rglob("*.py"))


def test_no_runtime_module_imports_the_harness_or_its_libraries():
    assert len(_runtime_modules()) > 20
    offending = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in _runtime_modules()
        for line, name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    ]
    assert not offending, "\n".join(offending)


def test_the_static_check_sees_relative_and_lazy_imports(tmp_path):
    """The checker itself: a lazy relative import of the harness inside a function is found."""
    probe = RUNTIME / "backends" / "_layer_probe.py"
    probe.write_text("def f():\n    from ...harness import sweep\n    import pandas\n")
    try:
        names = [name for _, name in _imports(probe)]
    finally:
        probe.unlink()
    assert "arxtune.harness.sweep" in names and "pandas" in names


def test_importing_every_runtime_module_loads_nothing_forbidden():
    modules = [_module_name(p) for p in _runtime_modules()]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"  # an optional dependency absent here (triton, pyverbs, vllm)
        "        if (exc.name or '').startswith('arxtune'):\n"
        "            raise\n"
        f"print(sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _runtime_edges() -> list[tuple[str, int, str]]:
    """(importer, line, imported runtime module) for every import between runtime modules."""
    modules = {_module_name(p) for p in _runtime_modules()}
    edges = []
    for path in _runtime_modules():
        for line, name in _imports(path):
            target = name if name in modules else name.rpartition(".")[0]  # `from pkg import module` or `import a name`
            if target in modules and target != "arxtune.runtime":
                edges.append((_module_name(path), line, target))
    return edges


def test_every_runtime_module_has_a_floor():
    unplaced = [m for m in map(_module_name, _runtime_modules()) if not _has_floor(m)]
    assert not unplaced, f"place these in FLOORS: {unplaced}"


def _has_floor(module: str) -> bool:
    try:
        floor_of(module)
    except KeyError:
        return False
    return True


def test_no_runtime_import_runs_up_a_floor():
    edges = _runtime_edges()
    assert len(edges) > 100
    upward = [
        f"{a} (floor {floor_of(a)}) line {line} imports {b} (floor {floor_of(b)})" for a, line, b in edges if floor_of(b) > floor_of(a)
    ]
    assert not upward, "\n".join(upward)


def test_no_cycle_between_the_runtime_packages():
    """Module by module a floor may import within itself; package by package (thresholds, backends, rdma, ...) nothing
    imports its way back to where it started (the registry and the thresholds file once did)."""
    top = {}
    for a, _, b in _runtime_edges():
        pa, pb = (m.removeprefix("arxtune.runtime.").split(".")[0] for m in (a, b))
        if pa != pb:
            top.setdefault(pa, set()).add(pb)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in top.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert len(top) > 10
    assert not [p for p in top if p in reach(p)]


def test_the_floor_check_sees_an_import_running_up():
    """The checker itself: thresholds (facts) importing the registry (backends) is an arrow up."""
    assert floor_of("arxtune.runtime.backends") > floor_of("arxtune.runtime.thresholds")
    assert floor_of("arxtune.runtime.backends.nccl") == floor_of("arxtune.runtime.backends")
    assert floor_of("arxtune.runtime.rdma.graph.gpu") == floor_of("arxtune.runtime.group")
    probe = RUNTIME / "_floor_probe.py"
    probe.write_text("def f():\n    from arxtune.runtime.backends import names\n")
    try:
        found = [name for _, name in _imports(probe)]
    finally:
        probe.unlink()
    assert "arxtune.runtime.backends" in found


def floor_graph() -> str:
    """The runtime's floors with each module's imports, one line per module (`python tests/unit/test_layers.py`)."""
    by_module: dict[str, set[str]] = {}
    for a, _, b in _runtime_edges():
        by_module.setdefault(a, set()).add(b)
    lines = []
    for level, _ in enumerate(FLOORS):
        lines.append(f"floor {level}:")
        for module in sorted(m for m in map(_module_name, _runtime_modules()) if floor_of(m) == level):
            short = module.removeprefix("arxtune.runtime.")
            deps = sorted(f"{d.removeprefix('arxtune.runtime.')}({floor_of(d)})" for d in by_module.get(module, ()) if d != module)
            lines.append(f"  {short} -> {' '.join(deps)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(floor_graph())
