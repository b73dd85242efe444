"""The file rules: outputs staged and published together (Staged), one writer per directory (WriterLock)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from arxtune.runtime import fileio
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.fileio import WRITER_LOCK, Staged, WriterLock, check_unlocked


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_staged_outputs_appear_together_and_only_when_all_were_written(tmp_path):
    (tmp_path / "a.json").write_text("old a")
    with Staged() as out:
        out.write_text(tmp_path / "a.json", "new a", "first")
        out.write_text(tmp_path / "b.csv", "new b", "second")
        assert _files(tmp_path)["a.json"] == b"old a" and "b.csv" not in _files(tmp_path)  # nothing before the end
    assert _files(tmp_path) == {"a.json": b"new a", "b.csv": b"new b"}


def test_a_failure_before_publishing_leaves_every_file_and_no_temporary(tmp_path):
    (tmp_path / "a.json").write_text("old a")
    with pytest.raises(RuntimeError):
        with Staged() as out:
            out.write_text(tmp_path / "a.json", "new a", "first")
            out.write_text(tmp_path / "b.csv", "new b", "second")
            raise RuntimeError("the third output could not be made")
    assert _files(tmp_path) == {"a.json": b"old a"}


def test_a_rename_that_fails_puts_back_those_before_it(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text("old a")
    real = os.replace
    monkeypatch.setattr(
        fileio.os,
        "replace",
        lambda src, dst: (_ for _ in ()).throw(OSError(5, "Input/output error")) if str(dst).endswith("b.csv") else real(src, dst),
    )
    with pytest.raises(ArxtuneError, match="cannot write second .*b.csv \\(Input/output error\\); no file was changed"):
        with Staged() as out:
            out.write_text(tmp_path / "a.json", "new a", "first")
            out.write_text(tmp_path / "b.csv", "new b", "second")
    assert _files(tmp_path) == {"a.json": b"old a"}


def test_a_path_for_a_writer_keeps_the_suffix_and_mode(tmp_path):
    (tmp_path / "plot.png").write_bytes(b"old")
    os.chmod(tmp_path / "plot.png", 0o640)
    with Staged() as out:
        staged = out.path_for(tmp_path / "plot.png", "plot")
        assert staged.suffix == ".png" and staged.parent == tmp_path
        staged.write_bytes(b"new")
    assert _files(tmp_path) == {"plot.png": b"new"} and (tmp_path / "plot.png").stat().st_mode & 0o777 == 0o640


def test_one_writer_per_directory(tmp_path):
    first = WriterLock(tmp_path, "run X").acquire()
    with pytest.raises(ArxtuneError, match=f"run X is being written by pid {os.getpid()} on host "):
        WriterLock(tmp_path, "run X").acquire()
    with pytest.raises(ArxtuneError, match=f"pid {os.getpid()}"):
        check_unlocked(tmp_path, "run X")
    first.release()
    first.release()  # a second release does nothing
    assert not (tmp_path / WRITER_LOCK).exists()
    check_unlocked(tmp_path, "run X")
    WriterLock(tmp_path, "run X").acquire().release()


def test_a_lock_left_by_a_dead_writer_is_taken_over_with_a_warning(tmp_path):
    code = "import sys, os; from arxtune.runtime.fileio import WriterLock; WriterLock(sys.argv[1], 'r').acquire(); os._exit(0)"
    dead = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert dead.returncode == 0 and (tmp_path / WRITER_LOCK).exists()  # left behind, but no longer locked
    said = []
    lock = WriterLock(tmp_path, "run X").acquire(warn=said.append)
    assert len(said) == 1 and "run X: taking over from pid " in said[0] and "which no longer holds it" in said[0], said
    lock.release()
