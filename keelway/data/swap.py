"""Replacing an instance's database with a restored copy, so a crash at any point
leaves either the old database whole or the new one whole, never a mix.

The files: `db.sqlite3` (D) with its `-wal`/`-shm`/`-journal` sides, the verified copy
staged at `.tmp-restore-<id>.db` (uncommitted: a crash leaves it to the boot sweep),
`db.sqlite3.incoming` (the commit point) and the dir `.restore-aside/` (the old files).

The moves, each made durable (fsync dir) before the next; the states a crash leaves,
and what `finish` (run at boot, before any process of the instance is respawned, and by
the restore itself) makes of each:
1. staged only → the old D untouched and whole; the sweep removes the staged copy.
2. `incoming` exists (committed; every process of the instance was proven gone before
   it was written) → roll forward: the old D and its sides that are still in place move
   into `.restore-aside/`, `incoming` becomes D, the aside dir is removed.
3. sides partly moved aside, `incoming` still there → the same roll-forward: D alone
   without its `-wal` would lose committed rows, so nothing ever stops half-way here.
4. D is the new file, `incoming` gone, aside dir left → remove the aside dir.
The old files are kept aside until the new D is in place, so at no instant is there
neither a whole old database nor a whole new one on disk.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from keelway import failpoints
from keelway.data.snapshots import LEFTOVER_PREFIXES
from keelway.durable import TEMP_PREFIX, fsync_dir

SIDES = ("-wal", "-shm", "-journal", "")  # the sides before the main file
ASIDE = ".restore-aside"
STAGED_PREFIX = f"{TEMP_PREFIX}restore-"

failpoints.declare("restore.swap.aside", "restore.swap.placed")


def incoming(db: Path) -> Path:
    return db.with_name(db.name + ".incoming")


def staged_path(db: Path, snap_id: str) -> Path:
    return db.with_name(f"{STAGED_PREFIX}{snap_id}.db")


def commit(db: Path, staged: Path) -> None:
    """Make the verified, fsynced copy at `staged` the database to roll forward to.
    Call only once every process that could open `db` is proven gone."""
    os.replace(staged, incoming(db))
    fsync_dir(db.parent)


def finish(db: Path) -> bool:
    """Carry a committed swap through (idempotent; see the module header). True if it
    did anything."""
    aside = db.parent / ASIDE
    new = incoming(db)
    if not new.exists():
        if aside.exists():
            shutil.rmtree(aside)  # state 4: the new database is in place already
            fsync_dir(db.parent)
            return True
        return False
    aside.mkdir(mode=0o700, exist_ok=True)
    for side in SIDES:
        old = Path(f"{db}{side}")
        if old.exists():
            os.replace(old, aside / old.name)
    fsync_dir(aside)
    fsync_dir(db.parent)
    failpoints.hit("restore.swap.aside")
    os.replace(new, db)
    fsync_dir(db.parent)
    failpoints.hit("restore.swap.placed")
    shutil.rmtree(aside)
    fsync_dir(db.parent)
    return True


def swap(db: Path, staged: Path) -> None:
    """`commit`, then `finish`: after return `db` is the staged copy, sides and all."""
    commit(db, staged)
    finish(db)


def finish_all(data_root: Path) -> list[str]:
    """At boot, before any instance runs: finish every committed swap, and remove staged
    copies no swap committed to and what a crashed snapshot left. Returns the instances
    whose swap was finished."""
    finished: list[str] = []
    if not data_root.is_dir():
        return finished
    for entry in data_root.iterdir():
        db = entry / "db.sqlite3"
        if (incoming(db).exists() or (entry / ASIDE).exists()) and finish(db):
            finished.append(entry.name)
        for prefix in (STAGED_PREFIX, *LEFTOVER_PREFIXES):
            for leftover in entry.glob(f"{prefix}*"):
                leftover.unlink(missing_ok=True)
    return finished


def to_wal(path: Path) -> None:
    """Put the copy at `path` in WAL mode, as every instance database is, and fsync it.

    A snapshot is stored with a rollback journal (one self-contained file); the mode is
    recorded in the file's header, so this is a header write, checkpointed on close."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
