"""The runtime (what a vLLM worker imports) never reaches into the harness, pandas or matplotlib.

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
    offending = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                 for path in _runtime_modules() for line, name in _imports(path)
                 if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]
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
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as exc:\n"  # an optional dependency absent here (triton, pyverbs, vllm)
            "        if (exc.name or '').startswith('arxtune'):\n"
            "            raise\n"
            f"print(sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r})))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
