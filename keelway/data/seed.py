"""A seed's files: the verified copy, the database an import lays down with its
`<db>.seed` marker, and the names an import writes into the instance's env file.

No I/O decision lives here, only file effects and checks that the rollback
(keelway/deploy/seeding.py) runs as journaled steps. Each effect is idempotent, so a
step cut short by a crash is simply run again:
- Nothing is trusted until opened: `check_seed` opens a file read-only and asks
  `PRAGMA integrity_check`; the copy keelway stores of it is checked again where it
  lands and hashed there (`verify_sqlite`), the hash the lay-down is held to. The seed
  itself is not hashed: no record keeps its hash, and a big sparse seed would be read
  whole, holes and all, for nothing.
- A seed is read with the `-wal` beside it when there is one (what SQLite would serve
  from it), and never written: a read-only open, immutable when there is no `-wal`.
- `inspect` says what a seed brings (its tables and their rows), what laying it down
  takes (its used pages, not its apparent size: a sparse file or a big freelist is not
  blown up), and refuses views and triggers that do not compile against its schema
  (a write of the app's would fail on them).
- The stored copy is written by VACUUM INTO (a consistent read of the seed and its
  -wal, only the pages in use), the laid-down database by a sparse copy
  (keelway/data/sparse.py): neither takes more disk than the seed's data.
- Every file that must survive: temp, fsync, rename, fsync of the directory.
- The marker is laid down before the database and removed after it, so while any of
  the import's database is on disk the marker that proves it is the import's is too.
- The env file: the import writes the instance key, KEELWAY_DB and DATABASE_URL (the
  env file is read last into every process, so the import's database is what the
  instance opens). `retire_import_env` puts exactly those names back as `env_before`
  had them, and touches nothing else. Values never leave this module but into the file.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keelway.data import sparse
from keelway.data.swap import litestream_state, to_wal
from keelway.data.verify import Damaged, check_whole, verify_file
from keelway.data.verify import Verified as Verified  # a seed's check is every copy's
from keelway.durable import fsync_dir, sqlite_side_paths, temp_path, write_atomic
from keelway.runtime.environment import INSTANCE_KEY, read_env_file, write_env_file

MARKER_SUFFIX = ".seed"
# The names an import writes into the instance's env file (and the rollback puts back).
IMPORT_ENV_NAMES = (INSTANCE_KEY, "KEELWAY_DB", "DATABASE_URL")
# A statement's own refusal, not the schema's: a view with no INSTEAD OF trigger for
# the write probed, a generated column.
_PROBE_REFUSED = re.compile(r"cannot (modify|UPDATE generated column)")


class SeedRefused(Exception):
    """A copy that failed verification (or could not be read); nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Contents:
    """What a seed brings: its tables with their rows, whether a -wal beside it was
    read, and what it takes on disk once copied (its used pages)."""

    tables: tuple[tuple[str, int], ...]
    wal: bool
    need_bytes: int
    apparent_bytes: int

    @property
    def empty(self) -> bool:
        return not self.tables

    def view(self) -> dict[str, Any]:
        return {"tables": [{"name": n, "rows": r} for n, r in self.tables],
                "wal": self.wal, "need_bytes": self.need_bytes,
                "apparent_bytes": self.apparent_bytes}


def _read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the seed at `path`, reading its -wal if there is one
    (immutable otherwise: no -wal or -shm is created beside the user's file)."""
    mode = "ro" if Path(f"{path}-wal").exists() else "ro&immutable=1"
    return sqlite3.connect(f"file:{urllib.parse.quote(str(path.absolute()))}?mode={mode}",
                           uri=True, isolation_level=None)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def inspect(path: Path) -> Contents:
    """What the seed at `path` brings (see `Contents`); `SeedRefused` when a view or a
    trigger names what its schema lacks (a table, a column, a function). Read-only."""
    wal = Path(f"{path}-wal").exists()
    apparent = path.stat().st_size
    if apparent == 0:
        return Contents((), False, 0, 0)
    try:
        conn = _read_only(path)
    except sqlite3.Error as exc:
        raise SeedRefused(f"{path} cannot be opened: {exc}") from None
    try:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        page_bytes = int(conn.execute("PRAGMA page_size").fetchone()[0])
        schema = conn.execute("SELECT type, name, tbl_name FROM sqlite_master "
                              "WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'").fetchall()
        tables = [name for kind, name, _ in schema if kind == "table"]
        _check_schema(conn, schema)
        counted = tuple((name, int(conn.execute(
            f"SELECT count(*) FROM {_q(name)}").fetchone()[0])) for name in tables)
    except sqlite3.Error as exc:
        raise SeedRefused(f"{path} cannot be read: {exc}") from None
    finally:
        conn.close()
    return Contents(counted, wal, (pages - free) * page_bytes, apparent)


def _check_schema(conn: sqlite3.Connection, schema: list[tuple[str, str, str]]) -> None:
    """Every view and every trigger compiles against the seed's own schema: each view is
    prepared as a SELECT, and each table's (or view's) triggers by preparing the writes
    that fire them (EXPLAIN: prepared, never run)."""
    for kind, name, _ in schema:
        if kind == "view":
            try:
                conn.execute(f"EXPLAIN SELECT * FROM {_q(name)}").fetchall()
            except sqlite3.Error as exc:
                raise SeedRefused(f"view {name} cannot be read: {exc}") from None
    fired: dict[str, list[str]] = {}
    for kind, name, table in schema:
        if kind == "trigger":
            fired.setdefault(table, []).append(name)
    for table, triggers in sorted(fired.items()):
        columns = [row[1] for row in conn.execute(f"PRAGMA table_xinfo({_q(table)})")
                   if row[6] not in (2, 3)]  # not generated
        sets = ", ".join(f"{_q(c)} = {_q(c)}" for c in columns)
        for write in (f"INSERT INTO {_q(table)} DEFAULT VALUES",
                      f"UPDATE {_q(table)} SET {sets}" if sets else "",
                      f"DELETE FROM {_q(table)}"):
            if not write:
                continue
            try:
                conn.execute(f"EXPLAIN {write}").fetchall()
            except sqlite3.Error as exc:
                if _PROBE_REFUSED.search(str(exc)):
                    continue
                raise SeedRefused(
                    f"a write to {table} fails on its trigger"
                    f"{'s' if len(triggers) > 1 else ''} {', '.join(sorted(triggers))}: "
                    f"{exc}") from None


def mint_seed_id() -> str:
    """A new seed id (names.SEED_ID), never reused: 64 random bits."""
    return f"seed-{secrets.token_hex(8)}"


def check_seed(path: Path) -> None:
    """Open `path` read-only and check `PRAGMA integrity_check` is ok; raises
    `SeedRefused` saying what is wrong. The file itself is never written."""
    if not path.is_file():
        raise SeedRefused(f"{path} is not a file")
    try:
        check_whole(path)
    except Damaged as exc:
        raise SeedRefused(f"{path} is not a usable SQLite database: {exc.message}") from None


def verify_sqlite(path: Path) -> Verified:
    """Open `path` read-only, check `PRAGMA integrity_check` is ok, and hash it; raises
    `SeedRefused` saying what is wrong. The file itself is never written.

    One check for every copy keelway trusts (keelway/data/verify.py), said as a
    refusal of the seed."""
    if not path.is_file():
        raise SeedRefused(f"{path} is not a file")
    try:
        return verify_file(path)
    except Damaged as exc:
        raise SeedRefused(f"{path} is not a usable SQLite database: {exc.message}") from None


def store_copy(source: Path, dest: Path) -> Verified:
    """A consistent copy of the SQLite file `source` (with its -wal, if one is beside
    it) at `dest`, by VACUUM INTO: one read transaction, only the pages in use written,
    so a big freelist or a sparse file takes no more than its data. In WAL mode (as
    every instance database is), fsynced and renamed into place, then verified where it
    landed. Raises `SeedRefused`, leaving no file at `dest`, when the copy does not
    verify. A crash leaves a temp file the boot sweep removes."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = temp_path(dest)
    tmp.unlink(missing_ok=True)
    try:
        # Created empty with its final mode (VACUUM INTO takes an empty file), so the
        # copy is never readable by others; an empty seed stays an empty database.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        if source.stat().st_size > 0:
            src = _read_only(source)
            try:
                src.execute("VACUUM INTO ?", (str(tmp),))
            finally:
                src.close()
            to_wal(tmp)
        for side in sqlite_side_paths(tmp):
            side.unlink(missing_ok=True)
        _fsync_file(tmp)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except sqlite3.Error as exc:
        tmp.unlink(missing_ok=True)
        raise SeedRefused(f"{source} could not be copied: {exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        return verify_sqlite(dest)
    except SeedRefused:
        dest.unlink(missing_ok=True)
        raise


def marker_of(db: Path) -> Path:
    return db.with_name(db.name + MARKER_SUFFIX)


def local_seed_id(db: Path) -> str | None:
    """The seed the `<db>.seed` marker names; None when there is no marker. An
    unreadable marker raises OSError: the caller cannot tell whose data it is."""
    try:
        return marker_of(db).read_text().strip() or None
    except FileNotFoundError:
        return None


def lay_down(copy: Path, db: Path, seed: str, sha256: str) -> None:
    """The import's database at `db`, a sparse byte copy of the verified `copy` (runs
    of zeros are not written: keelway/data/sparse.py), with its
    marker naming `seed` laid down first. Whatever SQLite files were at `db` go (they
    can only be an earlier run of this same step: the import refused a path held by
    anyone else). Raises `SeedRefused` if the copy no longer hashes to `sha256`."""
    db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(marker_of(db), f"{seed}\n".encode())
    for side in sqlite_side_paths(db):
        side.unlink(missing_ok=True)
    tmp = temp_path(db)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        src = os.open(copy, os.O_RDONLY)
        try:
            digest, _size = sparse.copy(src, fd)
        finally:
            os.close(src)
        os.fsync(fd)
    finally:
        os.close(fd)
    if digest != sha256:
        tmp.unlink(missing_ok=True)
        raise SeedRefused(f"the stored copy {copy.name} changed since it was verified")
    os.replace(tmp, db)
    fsync_dir(db.parent)


def remove_local(db: Path) -> list[str]:
    """The import's local data gone: the database and its side files (the state its
    replicator kept beside it too), then the marker last. Idempotent; returns the
    names it removed."""
    removed = []
    state = litestream_state(db)
    if state.is_dir():
        shutil.rmtree(state)
        removed.append(state.name)
    for path in (db, *sqlite_side_paths(db), marker_of(db)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    if db.parent.is_dir():
        fsync_dir(db.parent)
        with contextlib.suppress(OSError):
            db.parent.rmdir()  # only when empty: anything else there is not ours
    return removed


def env_before(env_file: Path) -> dict[str, str | None]:
    """What the env file holds now of the names an import writes (None: absent)."""
    values = read_env_file(env_file)
    return {name: values.get(name) for name in IMPORT_ENV_NAMES}


def write_import_env(env_file: Path, db: Path, before: dict[str, str | None]) -> bool:
    """The import's key, minted, and its database in the env file; True if this wrote.
    A key already differing from `before`'s is the one this import minted earlier
    (a step run again after a crash): it is kept."""
    values = read_env_file(env_file)
    want = {"KEELWAY_DB": str(db), "DATABASE_URL": f"sqlite:///{db}"}
    key = values.get(INSTANCE_KEY)
    if not key or key == before.get(INSTANCE_KEY):
        want[INSTANCE_KEY] = secrets.token_urlsafe(32)
    if all(values.get(k) == v for k, v in want.items()):
        return False
    values.update(want)
    write_env_file(env_file, values)
    return True


def retire_import_env(env_file: Path, before: dict[str, str | None]) -> bool:
    """Put back, of the names an import writes, exactly what `before` had: a value it
    had is restored, a name it lacked is removed. Nothing else of the file changes.
    True if this wrote; idempotent. A missing env file with nothing to restore stays
    missing."""
    values = read_env_file(env_file)
    changed = False
    for name in IMPORT_ENV_NAMES:
        if name not in before:
            continue
        was = before[name]
        if was is None and name in values:
            del values[name]
            changed = True
        elif was is not None and values.get(name) != was:
            values[name] = was
            changed = True
    if changed:
        write_env_file(env_file, values)
    return changed


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
