"""The file rules every command shares.

Reads accept only small regular files of UTF-8 text, so a FIFO, a device or a
directory given by mistake is one clear error rather than a hang or an
unbounded read. Writes go to a temporary file beside the target and are
renamed into place, so a failed write leaves neither a half file nor a `.tmp`.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from arxtune.runtime.errors import ArxtuneError

#: Configs, meta.json and thresholds files are far below this.
SMALL_FILE_BYTES = 16 << 20


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def read_text(path: str | Path, what: str, limit: int = SMALL_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; anything else is one ArxtuneError."""
    path = Path(path)
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
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArxtuneError(f"{what} {path} is not UTF-8 text (byte {exc.start}); pass the right file") from None


def ensure_dir(path: str | Path, what: str) -> Path:
    """Create a directory (and its parents) or say in one line why it cannot be."""
    path = Path(path)
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
    path = Path(path)
    if path.is_dir():
        raise ArxtuneError(f"{what} {path} is a directory; give a file name")
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
