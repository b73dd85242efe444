"""Small C helpers, compiled on first use with the host's C compiler (`cc`, which
Triton needs on any GPU host anyway) into a per-user cache keyed by the machine
and the source's hash. Callers keep a Python path for hosts with no compiler."""

from __future__ import annotations

import hashlib
import os
import re
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "arxtune"


def _local_includes(source: Path) -> bytes:
    """The headers `source` includes with quotes (beside it), so a changed header makes a new build."""
    names = re.findall(rb'^\s*#\s*include\s+"([^"]+)"', source.read_bytes(), re.M)
    return b"".join((source.parent / n.decode()).read_bytes() for n in names)


def build(source: Path) -> Path:
    """The shared library built from `source`, compiling it if this source (with its local headers) has not been
    built here. Raises OSError."""
    code = source.read_bytes() + _local_includes(source)
    target = cache_dir() / f"{source.stem}-{platform.machine()}-{hashlib.sha256(code).hexdigest()[:16]}.so"
    if target.exists():
        return target
    compiler = shlex.split(os.environ.get("CC", "")) or [c for c in (shutil.which("cc") or shutil.which("gcc"),) if c]
    if not compiler:
        raise OSError("no C compiler (cc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)  # processes may build at once: rename into place
    os.close(fd)
    try:
        result = subprocess.run([*compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)], capture_output=True, text=True, timeout=120)
        if result.returncode:
            raise OSError(f"{' '.join(compiler)} failed: {result.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    except subprocess.SubprocessError as exc:
        raise OSError(f"{' '.join(compiler)} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
