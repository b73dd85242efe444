"""The file rules every command shares.

Reads accept only small regular files of UTF-8 text, so a FIFO, a device or a
directory given by mistake is one clear error rather than a hang or an
unbounded read. Writes go to a temporary file beside the target and are
renamed into place, so a failed write leaves neither a half file nor a `.tmp`;
a command that writes several files stages them all (`Staged`) and renames
them into place only once every one was written.

Every output a command writes is checked with `check_output` before the
command writes its first byte: never over one of the command's inputs, never
over a run directory's data, never over a FIFO, device or directory, never
over an existing file of another kind; a run name (`--run-id`) is a name,
never a path. So a command that fails leaves every file as it was.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from arxtune.runtime.errors import ArxtuneError

#: Configs, meta.json and thresholds files are far below this.
SMALL_FILE_BYTES = 16 << 20
#: The files a run directory's data is made of (arxtune.harness.results); no command writes over them but the sweep.
RUN_DATA_FILES = ("meta.json", "points.csv")
#: Longest run name.
MAX_NAME = 200


def _usable(path: str | Path, what: str) -> Path:
    """A path the system calls can take: no NUL byte, not absurdly long (a ValueError or ENAMETOOLONG otherwise)."""
    text = os.fspath(path)
    if "\0" in text:
        raise ArxtuneError(f"{what} {text!r} holds a NUL byte; no file has that name")
    if len(text.encode("utf-8", "surrogateescape")) > 4096:
        raise ArxtuneError(f"{what} is longer than 4096 bytes; no file has that name")
    return Path(path)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_exists(path: str | Path, what: str, hint: str = "") -> Path:
    """The path if it can be looked at; else one ArxtuneError that says why (not found, a symlink loop, no permission)."""
    path = _usable(path, what)
    try:
        os.stat(path)
    except FileNotFoundError:
        raise ArxtuneError(f"{what} {path} not found{hint}") from None
    except OSError as exc:
        raise ArxtuneError(f"cannot read {what} {path} ({_reason(exc)})") from None
    return path


def read_text(path: str | Path, what: str, limit: int = SMALL_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; anything else is one ArxtuneError."""
    path = _usable(path, what)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ArxtuneError(f"{what} {path} not found") from None
    except OSError as exc:
        raise ArxtuneError(f"cannot read {what} {path} ({_reason(exc)})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ArxtuneError(f"{what} {path} is {kind}; pass a file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ArxtuneError(f"{what} {path} is larger than {limit >> 20} MiB; it is not an arxtune file")
    if data.startswith(b"\xef\xbb\xbf"):
        raise ArxtuneError(
            f"{what} {path} starts with a UTF-8 byte-order mark, which TOML and JSON do not allow; save it as UTF-8 without one"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArxtuneError(f"{what} {path} is not UTF-8 text (byte {exc.start}); pass the right file") from None


def ensure_dir(path: str | Path, what: str) -> Path:
    """Create a directory (and its parents) or say in one line why it cannot be."""
    path = _usable(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ArxtuneError(f"{what} {path} is a file, not a directory; choose another") from None
    except OSError as exc:
        raise ArxtuneError(f"cannot create {what} {path} ({_reason(exc)}); choose another") from None
    return path


def check_writable_dir(path: str | Path, what: str) -> Path:
    """Make sure files can be created in `path` (created if missing) before any work starts."""
    path = ensure_dir(path, what)
    try:
        fd, probe = tempfile.mkstemp(prefix=".arxtune-probe-", dir=path)
    except OSError as exc:
        raise ArxtuneError(f"cannot write in {what} {path} ({_reason(exc)}); choose another") from None
    os.close(fd)
    os.unlink(probe)
    return path


def check_writable_file(path: str | Path, what: str) -> Path:
    """Refuse an output path that is a directory or whose folder cannot take files, before any work starts."""
    path = _usable(path, what)
    if str(path) in ("", "."):
        raise ArxtuneError(f"{what} is empty; give a file name")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ArxtuneError(f"{what} {path} is {_kind(mode)}; give a regular file name")
    check_writable_dir(path.parent, f"folder of {what}")
    return path


def _new_file_mode(path: Path) -> int:
    """The mode a plain open() would give: the old file's, else 0o666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_bytes_atomic(path: str | Path, data: bytes, what: str) -> Path:
    """Write `data` to `path` all at once: the old file stays whole until the new one is complete."""
    path = check_writable_file(path, what)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _new_file_mode(path))
        os.replace(tmp, path)
    except OSError as exc:
        raise ArxtuneError(f"cannot write {what} {path} ({_reason(exc)}); choose another path") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text_atomic(path: str | Path, text: str, what: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), what)


class Staged:
    """A command's outputs, staged beside their targets and published together, only when all were written.

        with Staged() as out:
            out.write_text(path, text, "thresholds file")
            image = out.path_for(plot_path, "plot")  # for a writer that wants a path (keeps the suffix)
            ...
        # leaving without an exception renames every file into place; with one, removes every staged file

    So a command that fails at any step, the last write included, leaves every earlier file byte for byte:
    nothing is renamed before everything was written, and a rename that fails puts back those before it.
    """

    def __init__(self) -> None:
        self._staged: dict[str, tuple[Path, Path, str, int]] = {}  # target's absolute path -> (temporary, target, what, mode)

    def path_for(self, path: str | Path, what: str) -> Path:
        """A temporary file beside `path` (same suffix) that is renamed onto `path` when the outputs are published."""
        path = check_writable_file(path, what)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
        except OSError as exc:
            raise ArxtuneError(f"cannot write {what} {path} ({_reason(exc)}); choose another path") from None
        os.close(fd)
        key = os.path.abspath(path)
        if key in self._staged:  # the same file named twice (--out X and an install target X): the later content wins
            os.unlink(self._staged[key][0])
        self._staged[key] = (Path(tmp), path, what, _new_file_mode(path))
        return Path(tmp)

    def write_bytes(self, path: str | Path, data: bytes, what: str) -> Path:
        tmp = self.path_for(path, what)
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise ArxtuneError(f"cannot write {what} {path} ({_reason(exc)}); choose another path") from None
        return Path(path)

    def write_text(self, path: str | Path, text: str, what: str) -> Path:
        return self.write_bytes(path, text.encode("utf-8"), what)

    def publish(self) -> None:
        """Rename every staged file onto its target; if one cannot be, those renamed before it are put back."""
        done: list[tuple[Path, Path | None]] = []
        try:
            for tmp, target, what, mode in self._staged.values():
                try:
                    backup = _keep_copy(target)
                    done.append((target, backup))
                    os.chmod(tmp, mode)
                    os.replace(tmp, target)
                except OSError as exc:
                    raise ArxtuneError(f"cannot write {what} {target} ({_reason(exc)}); no file was changed") from None
        except BaseException:
            for target, backup in reversed(done):
                if backup is not None:
                    os.replace(backup, target)
                elif os.path.lexists(target):
                    os.unlink(target)
            raise
        finally:
            self.discard()
            for _, backup in done:
                if backup is not None and os.path.lexists(backup):
                    os.unlink(backup)

    def discard(self) -> None:
        """Remove every staged file that was not published."""
        for tmp, *_ in self._staged.values():
            if os.path.lexists(tmp):
                os.unlink(tmp)
        self._staged.clear()

    def __enter__(self) -> "Staged":
        return self

    def __exit__(self, kind, exc, trace) -> None:
        if kind is None:
            self.publish()
        else:
            self.discard()


def _keep_copy(target: Path) -> Path | None:
    """A hard link to the file now at `target` (a copy where links are not allowed), to put back; None if none is there."""
    if not target.is_file():
        return None
    fd, backup = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
    os.close(fd)
    os.unlink(backup)
    try:
        os.link(target, backup)
    except OSError:
        shutil.copy2(target, backup)
    return Path(backup)


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` holds a run's data (a sweep's meta.json or points.csv)."""
    return any(os.path.lexists(Path(path) / name) for name in RUN_DATA_FILES)


def check_name(name: str, what: str) -> str:
    """A directory name made inside a chosen folder: one plain path component, never a path that leaves it."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or name.startswith(".")
        or len(name) > MAX_NAME
        or not name.isprintable()
    ):
        raise ArxtuneError(
            f"{what} {name!r} must be a plain name (no '/', not starting with '.', printable, at most {MAX_NAME} characters); "
            "choose the folder with --out"
        )
    return name


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def check_output(path: str | Path, what: str, inputs: Iterable[str | Path] = (), replaces: Callable[[Path], bool] | None = None) -> Path:
    """Refuse, before anything is written, an output that would destroy something or cannot be written.

    `inputs`: files (or directories, meaning every file in them) the command reads; `replaces(path)`: whether
    an existing file is one this output may replace (e.g. an older thresholds file), None for any regular file.
    Its folder is created if missing (an empty folder loses nothing) and probed with a file of its own.
    """
    if str(path) in ("", "."):
        raise ArxtuneError(f"{what} is empty; give a file name")
    path = _usable(path, what)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # a folder on the way that is a file: said by check_writable_dir
        st = None
    except OSError as exc:
        raise ArxtuneError(f"cannot use {what} {path} ({_reason(exc)}); choose another") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ArxtuneError(f"{what} {path} is {_kind(st.st_mode)}; give a regular file name")
    for source in inputs:
        source = Path(source)
        if _same_file(path, source) or (source.is_dir() and _same_file(path.parent, source) and path.name in RUN_DATA_FILES):
            raise ArxtuneError(f"{what} {path} is an input of this command; write elsewhere")
    if path.name in RUN_DATA_FILES and is_run_dir(path.parent):
        raise ArxtuneError(f"{what} {path} is part of the run in {path.parent}; write elsewhere")
    if st is not None and replaces is not None and not replaces(path):
        raise ArxtuneError(f"{what} {path} exists and is not a file of that kind; remove it or choose another name")
    check_writable_dir(path.parent, f"folder of {what}")
    return path


def check_run_folder(out: str | Path, what: str) -> Path:
    """A folder that receives run directories: not empty, not itself a run, a directory where one can write."""
    if str(out) == "":
        raise ArxtuneError(f"{what} is empty; give a directory (default results/)")
    _usable(out, what)
    if is_run_dir(out):
        raise ArxtuneError(f"{what} {out} is a run directory, not a folder of runs; choose its parent or another")
    return check_writable_dir(out, what)


#: The file in a run directory that its one writer holds locked (fcntl.flock) for the run's life.
WRITER_LOCK = "writer.lock"


class WriterLock:
    """One writer per directory: an advisory lock (flock) on DIR/writer.lock, held until `release()`.

    The kernel holds the lock, not the file: it ends with its process however that process ends, so a lock
    file that is there but not locked was left by a writer that died, and is taken over with a warning naming
    it. Whether a holder on another host is alive is never guessed from its pid: on a network filesystem the
    server keeps the lock while that host's lease lasts. A filesystem that cannot lock at all is a warning,
    and the writer goes on alone. Readers never take it.
    """

    def __init__(self, directory: str | Path, what: str):
        self.path = Path(directory) / WRITER_LOCK
        self.what = what
        self._fd: int | None = None

    def acquire(self, warn: Callable[[str], None] | None = None) -> "WriterLock":
        """Take the lock or raise one ArxtuneError naming the holder's pid and host."""
        import fcntl
        import json
        import socket
        from datetime import datetime, timezone

        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ArxtuneError(f"cannot lock {self.what} ({self.path}: {_reason(exc)})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ArxtuneError(
                    f"{self.what} is being written by {holder(self.path)}; wait for it to end or stop it, then try again"
                ) from None
            except OSError as exc:  # ENOLCK: this filesystem has no locks
                os.close(fd)
                (warn or _warn)(f"arxtune: cannot lock {self.path} ({_reason(exc)}); make sure no other sweep writes {self.what}")
                return self
            if os.path.exists(self.path) and os.path.samestat(os.fstat(fd), os.stat(self.path)):
                break
            os.close(fd)  # the file we locked was removed by the writer before us as it let go: lock the new one
        before = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if before:
            (warn or _warn)(
                f"arxtune: {self.what}: taking over from {_describe(before)}, which no longer holds it (it ended without letting go)"
            )
        me = json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (me + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file, then let go (in that order: a writer after us locks a file of its own)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)


def holder(lock_path: str | Path) -> str:
    """'pid N on host H (since T)' from a lock file, as well as it can be read."""
    try:
        text = Path(lock_path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return _describe(text)


def _describe(text: str) -> str:
    import json

    try:
        data = json.loads(text)
        return f"pid {int(data['pid'])} on host {str(data['host'])[:100]} (since {str(data.get('since', '?'))[:40]})"
    except (ValueError, KeyError, TypeError):
        return "another process (its lock file does not say which)"


def check_unlocked(directory: str | Path, what: str) -> None:
    """Refuse early, without taking it, when another process holds `directory`'s writer lock."""
    import fcntl

    path = Path(directory) / WRITER_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody writes
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ArxtuneError(f"{what} is being written by {holder(path)}; wait for it to end or stop it, then try again") from None
    except OSError:
        pass
    finally:
        os.close(fd)


def _warn(message: str) -> None:
    import logging

    logging.getLogger("arxtune").warning("%s", message)
