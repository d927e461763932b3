"""A run's files as a full disk (or a crash) leaves them: whole or untouched, never half.

- ``write_file_atomically``: a file (``summary.json``, ``config.yaml``) is written to a temp
  file beside it, flushed and fsync'd, then ``os.replace``d over it: a reader, or the next
  run, sees the old file or the new one.
- ``folder_written_whole``: the same for a folder (a checkpoint): built as ``<name>.tmp``,
  every file fsync'd, then renamed into place; on any error the temp folder is removed.
  Replacing a folder takes two renames (the old one aside as ``<name>.old``, the new one
  in); a crash between them leaves ``<name>.old`` alone, which ``recover_folder`` (called
  by whatever looks for the folder: the next write, a run's last checkpoint, ``--resume``)
  renames back. A single atomic exchange (Linux's ``renameat2(RENAME_EXCHANGE)``) is not
  in Python's standard library nor on every file system.
- ``LineFile``: JSON lines appended whole or not at all (one write per line; a failed
  write is cut back to the file's previous length).
- ``disk_full_error`` / ``disk_full_message``: whether a failure is a full disk (also
  behind a Ray task error or a Rust library's I/O error), and one line naming the file
  and its file system.

Every ``OSError`` raised here names the file it was writing (``filename``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

OWNER_ONLY = 0o600  # a run's files: read and written by the user who started it
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_RUST_IO_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's std::io::Error ends


def write_file_atomically(path: str | Path, data: str | bytes, mode: int = OWNER_ONLY) -> None:
    """``path`` holds ``data`` (file mode ``mode``), or, if anything fails, what it held before."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            _write_all(fd, payload)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _name_file(exc, path)
        raise
    _fsync_folder(path.parent)


@contextlib.contextmanager
def folder_written_whole(folder: str | Path) -> Iterator[Path]:
    """A temp folder (``<folder>.tmp``) to write ``folder``'s files into; when the block
    ends they are fsync'd and the temp folder replaces ``folder``. If the block (or the
    swap) fails, the temp folder is removed and ``folder`` is as it was."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    old = folder.with_name(folder.name + ".old")
    if recover_folder(folder) and old.exists():
        shutil.rmtree(old)  # a swap cut after the new folder went in: the old one's rest
    if tmp.exists():
        shutil.rmtree(tmp)  # a write that did not finish
    try:
        tmp.mkdir(parents=True)
        yield tmp
        _fsync_tree(tmp)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        _fsync_folder(folder.parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # best effort: the failure is what is raised
        if old.exists() and not folder.exists():
            old.rename(folder)
        _name_file(exc, tmp)
        raise
    if old.exists():
        shutil.rmtree(old)


def recover_folder(folder: str | Path) -> bool:
    """Undo a ``folder_written_whole`` swap that a crash cut between its two renames:
    ``<folder>.old`` (whole: it was ``folder``) is renamed back when ``folder`` is missing.
    Whether ``folder`` exists now."""
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    if not folder.exists() and old.is_dir() and not old.is_symlink():
        try:
            old.rename(folder)
        except FileExistsError:  # put back meanwhile (another process recovering it)
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
        _fsync_folder(folder.parent)
    return folder.exists()


class LineFile:
    """A file of text lines, appended whole or not at all: each line goes out in one
    ``write`` (unbuffered), and a write that fails (a full disk) is cut back to the
    file's length before it, so the file never ends in half a line."""

    def __init__(self, path: str | Path, exclusive: bool = False, mode: int = OWNER_ONLY) -> None:
        """Open ``path`` for appending (created with ``mode``; ``exclusive``: it must not
        exist yet, else ``FileExistsError``)."""
        self.path = Path(path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd = os.open(self.path, flags | (os.O_EXCL if exclusive else 0), mode)
        self._length = os.fstat(self._fd).st_size

    def append(self, line: str) -> None:
        """``line`` and a newline at the end of the file, or nothing and the error."""
        data = (line + "\n").encode()
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._length)
            except OSError as cut:
                exc.add_note(f"{self.path} could not be cut back to {self._length} bytes: {cut}")
            _name_file(exc, self.path)
            raise
        self._length += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def os_error_of(exc: BaseException) -> OSError | None:
    """The operating system's error behind ``exc``: itself, its causes and contexts, a Ray
    task error's ``cause``, or a Rust library's message ending ``(os error N)``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error
        found = _RUST_IO_ERROR.search(str(error)) if not isinstance(error, OSError) else None
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        todo += [error.__context__, error.__cause__, getattr(error, "cause", None)]
    return None


def disk_full_error(exc: BaseException) -> OSError | None:
    """The out-of-space error behind ``exc`` (no space, quota, file-size limit), if it is one."""
    error = os_error_of(exc)
    return error if error is not None and error.errno in DISK_FULL_ERRNOS else None


def file_system_of(path: str | Path) -> Path:
    """The mount point of the file system that holds ``path`` (or would)."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    while not os.path.ismount(where):
        where = where.parent
    return where


def disk_full_message(error: OSError, fallback: str | Path) -> str:
    """One line: what could not be written (``error.filename``, else ``fallback``), and its
    file system's mount point and free space."""
    path = Path(error.filename) if error.filename else Path(fallback)
    mount = file_system_of(path)
    try:
        usage = shutil.disk_usage(mount)
        room = f"{_bytes(usage.free)} free of {_bytes(usage.total)}"
    except OSError:
        room = "free space unknown"
    why = error.strerror or os.strerror(error.errno or errno.ENOSPC)
    limit = " (this process's file-size limit, ulimit -f)" if error.errno == errno.EFBIG else ""
    return f"{why}{limit} writing {path} (file system {mount}: {room})"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_folder(Path(root))


# What a file system that cannot fsync a folder answers: EINVAL (Linux's own, e.g. some
# network file systems), ENOTSUP/EOPNOTSUPP or ENOSYS (FUSE file systems without fsyncdir),
# EBADF (those that refuse fsync on a descriptor opened read-only). It then has nothing
# more to write: the rename is as durable as it makes renames.
FOLDER_FSYNC_UNSUPPORTED = frozenset(
    {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF}
)


def _fsync_folder(folder: Path) -> None:
    """The folder's entries (a rename) on disk, where its file system can fsync a folder
    (``FOLDER_FSYNC_UNSUPPORTED``)."""
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in FOLDER_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def _name_file(exc: BaseException, path: Path) -> None:
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = str(path)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
