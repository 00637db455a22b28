"""An instance's own SQLite database, laid down empty before anything of the app runs.

It lives with the instance's data: like snapshots, it opens an app's own database and
never keelway's store (tests/store/test_boundary.py checks both).

Why it is laid down at all: a real app that opens `KEELWAY_DB` without creating it
failed on its first start because the file did not exist yet (issue 10). The database
is made in a temp file (0600 from its creation, WAL mode set, fsynced) and linked into
place only if nothing is there, then the directory is fsynced: a crash leaves no
database or a whole empty one, never a torn one, and an app's existing database is
never touched. A temp file a crash left is swept by the next lay-down.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from keelway.durable import PRIVATE_FILE_MODE, fsync_dir, sqlite_side_paths, temp_path


def lay_down_db(path: Path) -> bool:
    """An empty WAL-mode database at `path` unless one is there; True if it made one.
    Idempotent: a repeat after a crash anywhere in it ends the same."""
    if path.exists():
        return False
    tmp = temp_path(path)
    for stale in (tmp, *sqlite_side_paths(tmp)):
        stale.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    os.close(fd)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        # WAL is recorded in the file's header, so it holds for every later opener;
        # a table write is what makes SQLite write that header (then it is dropped).
        conn.execute("PRAGMA journal_mode=WAL")
        # Durability is the fsync below, once, before the link: nobody can see the temp.
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("CREATE TABLE keelway_laydown(x)")
        conn.execute("DROP TABLE keelway_laydown")
    finally:
        conn.close()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never over a database that appeared meanwhile
        made = True
    except FileExistsError:
        made = False
    finally:
        for done in (tmp, *sqlite_side_paths(tmp)):
            done.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return made


def is_empty_wal(path: Path) -> bool:
    """Whether `path` is a database in WAL mode with no tables (what a test checks)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
    finally:
        conn.close()
    return bool(mode == "wal" and tables == 0)
