"""Replacing an instance's database with a restored copy, so a crash at any point
leaves either the old database whole or the new one whole, never a mix; and the
replaced database kept (SPEC §5.7: an operator may have restored the wrong copy).

The one swap of keelway: a snapshot restore and a replica restore both end here
(keelway/deploy/restore.py). The files, in the instance's data dir:
- `db.sqlite3` (D) with its `-wal`/`-shm`/`-journal` sides, and litestream's state dir
  `.db.sqlite3-litestream` (its positions in the replica of this very file);
- the verified copy staged at `.tmp-restore-<tag>.db` (uncommitted: a crash leaves it
  to the boot sweep);
- `db.sqlite3.incoming`, the commit point;
- `.restore-aside/`, the old files while the swap is under way;
- `kept/db-<stamp>/`, each database a restore replaced: its `db.sqlite3` with its
  `-wal` (the two open together as the database it was), kept until an operator
  removes it or it ages out (keelway/data/kept.py). A restore never replaces one.

The moves, each made durable (fsync dir) before the next; the states a crash leaves,
and what `finish` (run at boot, before any process of the instance is respawned, and by
the restore itself) makes of each:
1. staged only → the old D untouched and whole; the sweep removes the staged copy.
2. `incoming` exists (committed; every process of the instance was proven gone before
   it was written) → roll forward: the old D, its sides and its litestream state that
   are still in place move into `.restore-aside/`, `incoming` becomes D.
3. sides partly moved aside, `incoming` still there → the same roll-forward: D alone
   without its `-wal` would lose committed rows, so nothing ever stops half-way here.
4. D is the new file, `incoming` gone, aside dir left → the aside dir is renamed into
   `kept/` under a new id (a crash before the rename leaves state 4 again).
The old files are kept aside until the new D is in place, so at no instant is there
neither a whole old database nor a whole new one on disk; the new D never sits beside
the old one's litestream state, so its replicator starts from its own positions.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from keelway import failpoints
from keelway.data import kept
from keelway.data.snapshots import LEFTOVER_PREFIXES
from keelway.durable import SQLITE_SIDE_FILES, TEMP_PREFIX, fsync_dir, sqlite_side_paths

# The suffixes of a database's files, sides before the main file, for callers that name
# a staged copy's files by suffix (keelway/deploy/restore.py); derived, never listed here.
SIDES = (*SQLITE_SIDE_FILES, "")

ASIDE = ".restore-aside"
# A database's litestream state sits beside it under this suffix (litestream's own
# layout): a database swapped in must not inherit the positions of the one it replaced.
LITESTREAM_SUFFIX = "-litestream"
STAGED_PREFIX = f"{TEMP_PREFIX}restore-"
# What an older keelway left while replacing its one kept copy: deleted at boot.
DISCARDED = f"{TEMP_PREFIX}discard-{kept.LEGACY_DB}"

failpoints.declare("restore.swap.aside", "restore.swap.placed", "restore.swap.kept")


def litestream_state(db: Path) -> Path:
    return db.parent / f".{db.name}{LITESTREAM_SUFFIX}"


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
            _keep(db, aside)  # state 4: the new database is in place already
            return True
        return False
    aside.mkdir(mode=0o700, exist_ok=True)
    for old in (*sqlite_side_paths(db), db, litestream_state(db)):  # the sides first
        if old.exists():
            os.replace(old, aside / old.name)
    fsync_dir(aside)
    fsync_dir(db.parent)
    failpoints.hit("restore.swap.aside")
    os.replace(new, db)
    fsync_dir(db.parent)
    failpoints.hit("restore.swap.placed")
    _keep(db, aside)
    return True


def _keep(db: Path, aside: Path) -> Path | None:
    """The aside dir goes into `kept/`, holding the replaced database and its -wal
    only: its -shm is rebuilt by whoever opens it, and its litestream positions belong
    to a replica that has moved on. Returns where it went; None when the restore
    replaced no database (there was none). Every copy kept before stays as it was."""
    if not (aside / db.name).exists():
        shutil.rmtree(aside)
        fsync_dir(db.parent)
        return None
    for name in (f"{db.name}-shm", litestream_state(db).name):
        stale = aside / name
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    dest = kept.keep(db, aside)
    failpoints.hit("restore.swap.kept")
    return dest


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
        shutil.rmtree(entry / DISCARDED, ignore_errors=True)
        kept.sweep(entry)
        kept.sweep(kept.kept_dir(db))
        for prefix in (STAGED_PREFIX, *LEFTOVER_PREFIXES):
            for leftover in entry.glob(f"{prefix}*"):
                leftover.unlink(missing_ok=True)
    return finished


def to_wal(path: Path) -> None:
    """Put the copy at `path` in WAL mode, as every instance database is.

    A snapshot keeps its database's header (WAL mode included), so this reads two bytes
    and is done (the caller fsyncs the copy before its commit point anyway); a copy in
    rollback-journal mode (a replica's restore) gets a header write, checkpointed on
    close, and fsynced here."""
    with open(path, "rb") as handle:
        header = handle.read(20)
    if len(header) == 20 and header[18] == 2 and header[19] == 2:
        return  # the header's read and write versions: 2 is WAL
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
