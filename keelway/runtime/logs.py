"""Per-generation log files, their rotation, and reading them back.

A generation writes its stdout/stderr straight into `<service>.<gen>.log` opened with
O_APPEND. Rotation copies the file aside and truncates it in place (copytruncate):
the process never reopens anything, so rotation needs no cooperation from the app and
works while the control plane is down and back. The few bytes written between the copy
and the truncate may be lost; that is the price of not piping logs through us.

A log may hold whatever an app prints, secrets included: every log file and rotated copy
is created 0600 (`open_for_append`, `_copy_private`), never widened later.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from keelway.durable import PRIVATE_FILE_MODE, disk_full

MAX_LOG_BYTES = 10 * 1024 * 1024
KEEP_ROTATED = 3
_COPY_CHUNK_BYTES = 1024 * 1024


def log_path(log_dir: Path, service: str, gen_id: int) -> Path:
    return log_dir / f"{service}.{gen_id}.log"


def open_for_append(path: Path) -> int:
    """A descriptor to hand a child as its stdout/stderr: O_APPEND, created 0600."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)


def parse_log_name(path: Path) -> tuple[str, int] | None:
    # From the right: a job's service (`job.NAME`) has a dot of its own.
    parts = path.name.rsplit(".", 2)
    if len(parts) != 3 or parts[2] != "log" or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def rotate_if_large(path: Path, max_bytes: int = MAX_LOG_BYTES, keep: int = KEEP_ROTATED) -> bool:
    """Rotate `path` if it is over `max_bytes`; True if it did.

    The copy is made first, under a name no reader takes for a log, and only then are
    the older copies shifted: a copy the disk has no room for leaves the log and its
    copies as they were (False), and the next call tries again.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= max_bytes:
        return False
    pending = path.with_name(f"{path.name}.rotating")
    try:
        _copy_private(path, pending)
    except OSError as exc:
        pending.unlink(missing_ok=True)
        if disk_full(exc):
            return False
        raise
    for n in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
    os.replace(pending, path.with_name(f"{path.name}.1"))
    with open(path, "r+b") as handle:
        handle.truncate(0)
    # Its times (runtime/log_times.py) spoke of the bytes just moved aside.
    path.with_name(f"{path.name}.times").unlink(missing_ok=True)
    return True


def _copy_private(source: Path, dest: Path) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    with open(source, "rb") as src, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out, _COPY_CHUNK_BYTES)


def tail_lines(path: Path, lines: int, chunk_bytes: int = 64 * 1024) -> tuple[list[str], int]:
    """The last `lines` lines of a file and the offset where the file ended."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            start = max(0, end - chunk_bytes)
            handle.seek(start)
            data = handle.read(end - start)
    except FileNotFoundError:
        return [], 0
    text = data.decode("utf-8", "replace").splitlines()
    if start > 0 and text:
        text = text[1:]  # the first line was cut by the chunk boundary
    return text[-lines:] if lines > 0 else [], end


def read_from(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended since `offset`; the new offset (restarts at 0 after a truncate)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            if end < offset:
                offset = 0
            handle.seek(offset)
            data = handle.read(end - offset)
    except FileNotFoundError:
        return [], offset
    cut = data.rfind(b"\n")
    if cut < 0:
        return [], offset
    return data[:cut].decode("utf-8", "replace").split("\n"), offset + cut + 1
