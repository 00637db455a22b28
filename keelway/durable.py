"""Durable file writes: temp -> fsync -> rename -> fsync directory; private modes; a full disk.

A file written here is either the old content or the new content after a crash at any
instruction, never a torn mix. Temp files carry the prefix `.tmp-` so that a sweep at
open (`sweep_temp`) can remove what a crash left behind.

Modes: every file keelway writes is created with its final mode, owner-only (0600)
unless a caller says otherwise, so a secret is never readable by others even for an
instant; chmod after creation would leave a window.

A full disk is recognised in one place, `disk_full`, for every boundary that reports it
(the API, the daemon's start): ENOSPC/EDQUOT from the OS and SQLITE_FULL from SQLite,
wherever they sit in an exception's chain.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

TEMP_PREFIX = ".tmp-"
PRIVATE_FILE_MODE = 0o600
# The files SQLite keeps beside a database `D`, as `D-wal` etc.: one file with it.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or anything in its cause/context chain, says the disk is full."""
    # Imported here, not at the top: the CLI imports this module for its hint alone and
    # must start without loading sqlite3.
    import sqlite3

    for current in _chain(exc):
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        # errors the sqlite3 module raises itself (a closed connection) carry no code
        if isinstance(current, sqlite3.Error) and (
                getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL):
            return True
    return False


def disk_full_message(exc: BaseException) -> str:
    """What a user reads when `disk_full(exc)`: that, and the file that could not grow."""
    for current in _chain(exc):
        # a copy names its source first and its destination, the file that grew, second
        filename = getattr(current, "filename2", None) or getattr(current, "filename", None)
        if filename:
            return f"the disk is full: no space left to write {filename}"
    return "the disk is full"


DISK_FULL_HINT = (
    "free space on the filesystem that holds $KEELWAY_HOME (`df` shows it), then retry; "
    "nothing was changed half-way, and keelway carries on by itself once there is room"
)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes/contexts, outermost first (a cycle is cut)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def create_private(path: Path, mode: int = PRIVATE_FILE_MODE) -> None:
    """Create `path` empty with `mode` unless it exists (its content is kept).

    For files another program fills in, such as SQLite's database, which then gives its
    `-wal` and `-shm` the same mode.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode)
    os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file.

    The temp file is created with `mode` from the start, so a secret is never readable
    by others even for an instant.
    """
    path = Path(path)
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)  # umask may have narrowed it at creation
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sweep_temp(directory: Path) -> list[Path]:
    """Remove temp files a crash left in `directory`; returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(Path(directory).iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        if entry.name.startswith(TEMP_PREFIX) and (entry.is_file() or entry.is_symlink()):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def symlink_atomic(link: Path, target: Path) -> None:
    """Point `link` at `target`, replacing any previous link in one rename."""
    link = Path(link)
    tmp = link.with_name(f"{TEMP_PREFIX}{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)
