"""Durable file writes: temp -> fsync -> rename -> fsync directory.

A file written here is either the old content or the new content after a crash at any
instruction, never a torn mix. Temp files carry the prefix `.tmp-` so that a sweep at
open (`sweep_temp`) can remove what a crash left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMP_PREFIX = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
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
