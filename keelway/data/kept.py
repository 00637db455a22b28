"""The copies a restore keeps: every database it replaced, and every file replica it
set aside, each until an operator removes it or it ages past the retention.

The rule (SPEC §4 Data, §5.7): no restore destroys the only copy of data newer than what
it puts back. A restore replaces the database and (for a file replica) sets the replica
aside; either may hold rows that nothing else holds (writes acknowledged after the last
snapshot, or between two restores), so neither is ever replaced by the next restore:
- a replaced database is kept in `<data dir>/kept/db-<UTC stamp>/`, its `db.sqlite3`
  with its `-wal` (the two open together as the database it was);
- a set-aside file replica is `<replicas>/<host>_replaced-<epoch ms>` (`_` is in no
  host name, so it is never another instance's replica; a step run again after a crash
  finds no replica left to rename, so one restore sets aside one);
- a database an older keelway kept is still listed: `previous-db/`, and a replica
  `<host>.replaced` unless that is the name of an instance (its own replica, then).
A copy's age is the time in its name, not its mtime (opening a kept database with
sqlite3 writes beside it); an older keelway's copies, named without one, age by mtime.
Removal (`forget`: `keelway db forget H COPY`, or `keelway gc` for copies past the
retention) renames the copy to a `.tmp-forget-` name first, the commit point, then
deletes it: a crash leaves a whole copy still listed, or a renamed one that nothing
lists and `sweep` deletes (at boot in a data dir, at the next forget beside it in the
replicas dir).
"""

from __future__ import annotations

import calendar
import contextlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keelway import failpoints
from keelway.durable import TEMP_PREFIX, fsync_dir

failpoints.declare("kept.forget.before", "kept.forget.after")

KEPT = "kept"
# What an older keelway kept of the latest restore (one database, one replica).
LEGACY_DB = "previous-db"
LEGACY_REPLICA_SUFFIX = ".replaced"
FORGET_PREFIX = f"{TEMP_PREFIX}forget-"
# How long a kept copy stays before `keelway gc` removes it; KEELWAY_KEEP_REPLACED_DAYS
# (read by the control plane) says otherwise.
RETENTION_S = 7 * 86400.0
REPLICA_MARK = "_replaced-"
_REPLICA = re.compile(r"^(?P<host>.+)(?:_replaced-(?P<ms>[0-9]+)|\.replaced)$")
_DB = re.compile(r"^db-(?P<stamp>[0-9]{8}T[0-9]{6}Z)(?:-[0-9]+)?$")
_STAMP = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class KeptCopy:
    id: str  # what `db forget H COPY` names: db-<stamp>, replica-<ms>, previous-db
    kind: str  # "database" or "replica"
    path: Path
    kept_at: float  # epoch seconds
    disk_bytes: int  # what it takes on disk (allocated blocks)

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "path": str(self.path),
                "kept_at": self.kept_at, "disk_bytes": self.disk_bytes}


def retention_s() -> float:
    """The retention in force: KEELWAY_KEEP_REPLACED_DAYS, else 7 days."""
    days = os.environ.get("KEELWAY_KEEP_REPLACED_DAYS")
    try:
        return float(days) * 86400.0 if days else RETENTION_S
    except ValueError:
        return RETENTION_S


def kept_dir(db: Path) -> Path:
    return db.parent / KEPT


def keep(db: Path, aside: Path) -> Path:
    """Move the directory `aside` (the replaced database and its -wal) into `kept/`
    under a new id; returns where it went. Durable before return."""
    root = kept_dir(db)
    if not root.is_dir():
        root.mkdir(mode=0o700)
        fsync_dir(db.parent)
    stamp = time.strftime(_STAMP, time.gmtime())
    dest = root / f"db-{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = root / f"db-{stamp}-{n}"
    os.replace(aside, dest)
    fsync_dir(root)
    fsync_dir(db.parent)
    return dest


def databases(db: Path) -> list[KeptCopy]:
    """The replaced databases kept beside `db`, oldest first."""
    found = []
    root = kept_dir(db)
    entries = sorted(root.iterdir()) if root.is_dir() else []
    legacy = db.parent / LEGACY_DB
    for entry in [legacy, *entries] if legacy.is_dir() else entries:
        if entry.is_dir() and not entry.name.startswith(TEMP_PREFIX):
            match = _DB.match(entry.name)
            at = (calendar.timegm(time.strptime(match["stamp"], _STAMP)) if match
                  else entry.stat().st_mtime)
            found.append(KeptCopy(entry.name, "database", entry, at, _disk_bytes(entry)))
    return sorted(found, key=lambda c: (c.kept_at, c.id))


def set_replica_aside(replica: Path) -> Path | None:
    """Rename the file replica `replica` aside, never over another one; returns where
    it went. Idempotent: no replica there (a step run again), no move."""
    if not replica.exists():
        return None
    ms = int(time.time() * 1000)
    while (aside := replica.with_name(f"{replica.name}{REPLICA_MARK}{ms}")).exists():
        ms += 1
    os.replace(replica, aside)
    fsync_dir(replica.parent)
    return aside


def replicas(replica: Path, hosts: set[str]) -> list[KeptCopy]:
    """The file replicas set aside beside `replica` (the host's own), oldest first.
    `hosts`: every instance's name (an older keelway's `<host>.replaced` may be one)."""
    if not replica.parent.is_dir():
        return []
    found = []
    for entry in replica.parent.iterdir():
        match = _REPLICA.match(entry.name)
        if (match is None or match["host"] != replica.name or not entry.is_dir()
                or entry.name in hosts):
            continue
        ms = match["ms"]
        found.append(KeptCopy(f"replica-{ms}" if ms else "replica-replaced", "replica",
                              entry, int(ms) / 1000 if ms else entry.stat().st_mtime,
                              _disk_bytes(entry)))
    return sorted(found, key=lambda c: (c.kept_at, c.id))


def aged(copies: list[KeptCopy], now_s: float, keep_s: float) -> list[KeptCopy]:
    return [c for c in copies if now_s - c.kept_at >= keep_s]


def forget(copy: KeptCopy) -> None:
    """Remove `copy`: renamed out of every listing first (the commit point), then
    deleted; and what an earlier forget cut short beside it. Idempotent."""
    sweep(copy.path.parent)
    if not copy.path.exists():
        return
    gone = copy.path.with_name(f"{FORGET_PREFIX}{copy.path.name}")
    failpoints.hit("kept.forget.before")
    os.replace(copy.path, gone)
    fsync_dir(copy.path.parent)
    failpoints.hit("kept.forget.after")
    shutil.rmtree(gone, ignore_errors=True)


def sweep(directory: Path) -> None:
    """Delete what a `forget` cut short by a crash left renamed in `directory`."""
    if directory.is_dir():
        for entry in directory.glob(f"{FORGET_PREFIX}*"):
            shutil.rmtree(entry, ignore_errors=True)


def _disk_bytes(directory: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total
