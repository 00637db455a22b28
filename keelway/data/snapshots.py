"""Snapshots of an instance's database: consistent online copies, verified, stored with
a manifest in the object store.

Taking one (`take`): SQLite's backup API copies the database, while its app may write,
to a temp file in the instance's data dir (the same filesystem, so the move into a local
store is a rename); then it is fsynced and verified (keelway/data/verify.py), the two at
once, and only then stored: the copy under `<id>.db`, then its manifest under
`<id>.json`. The manifest is the commit point: a snapshot without one is not listed,
restored or counted, and `prune` sweeps it.

Crash or failure windows: during the copy (a full disk, say) → the temp file is removed
and the store untouched; a crash leaves a `.tmp-` file that the daemon sweeps at boot.
After the `.db` put, before the manifest → an unlisted object, removed by `prune`.
The instance's database is only read: a failed snapshot leaves it as it was.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from keelway import failpoints, names
from keelway.data.objects import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    manifest_key,
    snapshot_key,
    snapshot_prefix,
)
from keelway.data.verify import MMAP_BYTES, Damaged, verify_file
from keelway.durable import PRIVATE_FILE_MODE, TEMP_PREFIX, sqlite_side_paths
from keelway.home import Home

failpoints.declare("snapshot.copy.before", "snapshot.copy.after",
                   "snapshot.put.before", "snapshot.put.after")


# Temp files a snapshot or a verify writes in the instance's data dir (and the temp of a
# download into one of them); what a crash leaves of them is removed at boot
# (`swap.finish_all`). An app's own files in its data dir never start so.
LEFTOVER_PREFIXES = (f"{TEMP_PREFIX}snapshot-", f"{TEMP_PREFIX}manifest-",
                     f"{TEMP_PREFIX}verify-", f"{TEMP_PREFIX}{TEMP_PREFIX}")


class NoDatabase(Exception):
    """The instance has no database file to snapshot."""


@dataclass(frozen=True)
class SnapshotManifest:
    instance: str
    id: str
    taken_at: float  # epoch seconds, UTC
    size: int
    sha256: str
    release: int | None
    schema_version: int  # PRAGMA user_version of the copy

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotManifest:
        data = json.loads(raw)
        release = data.get("release")
        return cls(instance=str(data["instance"]), id=names.SNAPSHOT_ID.check(data["id"]),
                   taken_at=float(data["taken_at"]), size=int(data["size"]),
                   sha256=str(data["sha256"]),
                   release=int(release) if release is not None else None,
                   schema_version=int(data["schema_version"]))


def copy_online(db: Path, dest: Path, *, fsync: bool = True) -> None:
    """A consistent copy of the live database `db` at `dest` (created 0600), fsynced.
    On any failure `dest` is removed and `db` is as it was.

    The copy is one read transaction of `db` (the backup in one step), written to a file
    nobody else can see yet, so its own journal and syncs are off: it is fsynced once at
    the end, and a crash before that leaves only a temp file, never a listed snapshot.
    The copy keeps `db`'s header, WAL mode included, so a restore needs no rewrite; with
    no `-wal` beside it, it is one self-contained file."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    os.close(fd)
    try:
        src = sqlite3.connect(db, isolation_level=None, timeout=5)
        try:
            src.execute(f"PRAGMA mmap_size={MMAP_BYTES}")  # the pages read, not copied
            out = sqlite3.connect(dest, isolation_level=None)
            try:
                out.execute("PRAGMA journal_mode=OFF")
                out.execute("PRAGMA synchronous=OFF")
                src.backup(out)
            finally:
                out.close()
        finally:
            src.close()
        if fsync:
            _fsync(dest)
    except BaseException:
        for path in (dest, *sqlite_side_paths(dest)):
            path.unlink(missing_ok=True)
        raise


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def take(objects: ObjectStore, home: Home, host: str, *, now_s: float,
         release: int | None, db: Path | None = None) -> SnapshotManifest:
    """Snapshot `host`'s database (`db`: the one in effect, if not its own) into
    `objects`; returns its manifest once stored.

    Raises NoDatabase, Damaged (the copy itself failed its check: nothing stored),
    ObjectStoreError or OSError/sqlite3.Error (a full disk): in every case the store
    holds no new listed snapshot and the database is untouched."""
    db = db if db is not None else home.db_path(host)
    if not db.is_file():
        raise NoDatabase(f"{host} has no database at {db}")
    _refuse_without_room(db)
    snap_id = names.snapshot_id(now_s, secrets.token_hex(2))
    tmp = db.with_name(f"{LEFTOVER_PREFIXES[0]}{snap_id}.db")
    failpoints.hit("snapshot.copy.before")
    copy_online(db, tmp, fsync=False)
    try:
        # The copy is flushed to disk while it is verified from the page cache (both
        # wait on I/O or release the GIL); nothing is stored before both are done.
        with ThreadPoolExecutor(1) as pool:
            flushed = pool.submit(_fsync, tmp)
            try:
                verified = verify_file(tmp)
            finally:
                flushed.result()
        failpoints.hit("snapshot.copy.after")
        manifest = SnapshotManifest(host, snap_id, now_s, verified.size_bytes, verified.sha256,
                                    release, verified.schema_version)
        failpoints.hit("snapshot.put.before")
        objects.adopt_file(snapshot_key(host, snap_id), tmp)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        _put_bytes(objects, manifest_key(host, snap_id), manifest.to_json(), db.parent)
    except BaseException:
        objects.delete(snapshot_key(host, snap_id))
        raise
    failpoints.hit("snapshot.put.after")
    return manifest


def _refuse_without_room(db: Path) -> None:
    """Raise ENOSPC before opening `db` when its dir cannot hold a copy of it.

    Why before: opening a WAL database creates its `-wal`/`-shm` when no app has it
    open (a parked instance), and on a full disk SQLite cannot remove them again; so a
    snapshot that cannot fit is refused before the database is touched at all."""
    wal = Path(f"{db}-wal")
    needed = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0) + (1 << 20)
    free = shutil.disk_usage(db.parent).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"no room for a snapshot of {db.name} ({needed} bytes "
                                    f"needed, {free} free)", str(db.parent))


def _put_bytes(objects: ObjectStore, key: str, data: bytes, scratch: Path) -> None:
    tmp = scratch / f"{LEFTOVER_PREFIXES[1]}{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        objects.put_file(key, tmp)
    finally:
        tmp.unlink(missing_ok=True)


def manifest(objects: ObjectStore, host: str, snap_id: str) -> SnapshotManifest:
    """The manifest of snapshot `snap_id` of `host`; raises ObjectNotFound."""
    with tempfile.TemporaryDirectory(prefix="keelway-manifest-") as scratch:
        path = Path(scratch) / "m.json"
        objects.get_file(manifest_key(host, snap_id), path)
        try:
            found = SnapshotManifest.from_json(path.read_bytes())
        except (ValueError, KeyError, TypeError, names.InvalidName) as exc:
            raise Damaged(f"snapshot {snap_id}: its manifest is unreadable: {exc}") from None
    if found.instance != host or found.id != snap_id:
        raise Damaged(f"snapshot {snap_id}: its manifest names {found.instance}/{found.id}")
    return found


def list_snapshots(objects: ObjectStore, host: str) -> list[SnapshotManifest]:
    """The stored snapshots of `host` that have a manifest, oldest first."""
    found = []
    for key in objects.list(snapshot_prefix(host)):
        if key.endswith(".json"):
            snap_id = key.rsplit("/", 1)[1][: -len(".json")]
            if names.SNAPSHOT_ID.accepts(snap_id):
                try:
                    found.append(manifest(objects, host, snap_id))
                except (ObjectNotFound, Damaged):
                    continue  # deleted meanwhile, or not ours to read: not listed
    return sorted(found, key=lambda m: m.id)


def fetch(objects: ObjectStore, host: str, snap_id: str, dest: Path, *,
          durable: bool = True) -> SnapshotManifest:
    """Download snapshot `snap_id` of `host` to `dest`, verify it against its manifest
    and (`durable`) fsync it; raises ObjectNotFound or Damaged (then `dest` is removed).

    As in `take`, the copy is flushed to disk while it is verified from the page cache:
    the fsync, the sha256 and the integrity check run at once, and it returns only
    once all three are done (a restore's commit point trusts a durable, checked file)."""
    found = manifest(objects, host, snap_id)
    objects.get_file(snapshot_key(host, snap_id), dest, synced=False)
    try:
        with ThreadPoolExecutor(1) as pool:
            flushed = pool.submit(_fsync, dest) if durable else None
            try:
                verified = verify_file(dest, found.sha256)
            finally:
                if flushed is not None:
                    flushed.result()
        if verified.size_bytes != found.size:
            raise Damaged(f"snapshot {snap_id}: {verified.size_bytes} bytes, not the recorded "
                          f"{found.size}")
    except BaseException:
        Path(dest).unlink(missing_ok=True)
        raise
    return found


def verify_stored(objects: ObjectStore, host: str, snap_id: str, scratch: Path) -> SnapshotManifest:
    """Fetch and verify a stored snapshot into `scratch` (removed after); raises
    ObjectNotFound or Damaged."""
    dest = scratch / f"{LEFTOVER_PREFIXES[2]}{snap_id}.db"
    try:
        return fetch(objects, host, snap_id, dest, durable=False)  # read, then removed
    finally:
        dest.unlink(missing_ok=True)


def delete(objects: ObjectStore, host: str, snap_id: str) -> None:
    """Remove a snapshot: its manifest first (then it is no longer listed), then its
    copy; a crash between leaves an unlisted copy that `prune` removes."""
    objects.delete(manifest_key(host, snap_id))
    objects.delete(snapshot_key(host, snap_id))


def prune(objects: ObjectStore, host: str, keep: int) -> list[str]:
    """Delete `host`'s snapshots beyond the newest `keep`, and copies left without a
    manifest; returns the ids removed."""
    listed = list_snapshots(objects, host)
    doomed = [m.id for m in listed[: max(0, len(listed) - keep)]]
    for snap_id in doomed:
        delete(objects, host, snap_id)
    with_manifest = {m.id for m in listed}
    for key in objects.list(snapshot_prefix(host)):
        snap_id = key.rsplit("/", 1)[1].rsplit(".", 1)[0]
        if key.endswith(".db") and snap_id not in with_manifest and snap_id not in doomed:
            objects.delete(key)
    return doomed


def newest(objects: ObjectStore, host: str) -> SnapshotManifest | None:
    listed = list_snapshots(objects, host)
    return listed[-1] if listed else None


__all__ = [
    "Damaged",
    "NoDatabase",
    "ObjectNotFound",
    "ObjectStoreError",
    "SnapshotManifest",
    "delete",
    "fetch",
    "list_snapshots",
    "manifest",
    "newest",
    "prune",
    "take",
    "verify_stored",
]
