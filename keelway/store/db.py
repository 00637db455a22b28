"""The SQLite store's one connection: transactions, the owner's lease, query helpers,
and the translation of sqlite3's errors into the store's (keelway/store/errors.py).

Every noun of the SQLite store (keelway/store/sqlite.py) holds the same `Db`, so an
intent that writes several nouns opens one transaction and each noun's write joins it.

The database holds config values, so it is created 0600 before SQLite opens it: SQLite
gives its `-wal` and `-shm` the database's mode, so all three are private from the start.

A full disk (SQLITE_FULL, ENOSPC) fails the one transaction that met it: it is rolled
back, whatever SQLite did on its own, and `DiskFull` says so. The connection stays usable,
so the store works again as soon as there is room, with nothing to reopen.

The lease: a `meta` row names the owner token of the one writer. Opening the store takes
it; every write checks it inside its BEGIN IMMEDIATE (one primary-key read in a
transaction already open), so a handle whose lease another took writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from keelway.clock import Clock, SystemClock
from keelway.durable import (
    PRIVATE_FILE_MODE,
    create_private,
    disk_full,
    sqlite_side_paths,
    sync_is_deferred,
)
from keelway.store import schema
from keelway.store.errors import Conflict, DiskFull, NotFound, StaleOwner, StoreError
from keelway.store.lifecycle import Removal

_LEASE = "lease_owner"

T = TypeVar("T")


def box_owner(path: Path) -> str:
    """The owner token of the one box that writes the store at `path`: the same for every
    handle opened on it there, so the box never refuses itself."""
    return f"box:{Path(path).resolve()}"


class Db:
    """The connection, its transactions and the lease, shared by every noun."""

    def __init__(self, path: Path, clock: Clock | None = None,
                 owner: str | None = None, *, read_only: bool = False) -> None:
        """`read_only`: a connection that only reads a store its writer has opened and
        migrated already: no lease taken, no schema touched, and SQLite refuses any
        write through it (a read-only open, `query_only`). What reads away from the
        event loop use (`SqliteStore.read_apart`)."""
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self.owner = owner if owner is not None else box_owner(self.path)
        self._depth = 0
        self._sync_deferred = False  # the connection's `synchronous`: NORMAL, or FULL
        # Commits made, and how many of them are known to be on disk (`sync`).
        self.committed = 0
        self.synced = 0
        if read_only:
            self._conn = _connect_read_only(self.path)
            return
        try:
            self._conn = _connect(self.path)
        except BaseException as exc:
            if disk_full(exc):
                raise DiskFull("open the store", self.path) from exc
            # A migration refused (a record this keelway cannot read) stays the driver's
            # error: nothing was opened, and tests/store/test_journal_kinds.py pins it.
            raise
        try:
            self._take_lease()
        except BaseException:
            self._conn.close()
            raise

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction: every read inside it sees the store as of one commit
        (WAL keeps that snapshot for it while the writer goes on)."""
        with self.reading(f"read {self.path}"):
            self._conn.execute("BEGIN")
        try:
            yield
        finally:
            if self._conn.in_transaction:
                self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()

    def fsync_log(self) -> None:
        """Every commit so far on disk: the WAL file fsynced, as a FULL commit would
        (the frames of NORMAL commits are in it, in the page cache). From any thread:
        it touches the file, not the connection. No WAL file: nothing is pending."""
        wal = sqlite_side_paths(self.path)[0]
        try:
            fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def tx(self, what: str, *, missing: str | None = None) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction of the lease's owner; nested calls join the
        outer one. `what` says what is written (an error names it); `missing`, what a
        foreign key refused names ("no generation 9"). Only the store's own methods open
        one: it is not part of the `Store` protocol."""
        if self._depth:
            self._depth += 1
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise _translated(what, missing, exc, self.path) from exc
            finally:
                self._depth -= 1
            return
        with self.reading(what):
            deferred = sync_is_deferred()
            if deferred != self._sync_deferred:
                # Per transaction (keelway/durable.py): in WAL mode, FULL fsyncs the log
                # at each commit; NORMAL leaves that to the next FULL commit (or
                # checkpoint), whose fsync covers every commit before it.
                self._conn.execute(f"PRAGMA synchronous={'NORMAL' if deferred else 'FULL'}")
                self._sync_deferred = deferred
            self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            self._refuse_stale_owner()
            yield self._conn
            self._conn.execute("COMMIT")
            self.committed += 1
            if not self._sync_deferred:
                self.synced = self.committed  # FULL: its fsync covers every commit before
        except BaseException as exc:
            # A COMMIT that fails (SQLITE_FULL) may or may not have rolled back by
            # itself; either way no transaction may stay open, or every later BEGIN
            # would fail long after the disk has room again.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error) or (disk_full(exc)
                                                  and not isinstance(exc, DiskFull)):
                raise _translated(what, missing, exc, self.path) from exc
            raise
        finally:
            self._depth = 0

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[sqlite3.Connection]:
        """The connection for a read outside a transaction (or a statement of its
        own); a driver error becomes the store's."""
        try:
            yield self._conn
        except sqlite3.Error as exc:
            raise _translated(what, None, exc, self.path) from exc

    def row(self, sql: str, *args: Any) -> sqlite3.Row | None:
        with self.reading(f"read {self.path}"):
            row: sqlite3.Row | None = self._conn.execute(sql, args).fetchone()
        return row

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        with self.reading(f"read {self.path}"):
            return list(self._conn.execute(sql, args).fetchall())

    def first(self, convert: Callable[[sqlite3.Row], T], sql: str, *args: Any) -> T | None:
        """The record of the first row `sql` reads, if any."""
        row = self.row(sql, *args)
        return convert(row) if row is not None else None

    def select(self, table: str, *, order: str, where: str | None = None,
               limit: int | None = None, **equal: object) -> list[sqlite3.Row]:
        """The rows of `table` whose columns equal each value given in `equal` (None:
        any), and that meet `where`, in `order`: every list read with an optional
        filter. Table, columns and `where` are this package's own words, never input."""
        given = {column: value for column, value in equal.items() if value is not None}
        tests = [f"{column}=?" for column in given] + ([where] if where else [])
        sql = (f"SELECT * FROM {table}" + (" WHERE " + " AND ".join(tests) if tests else "")
               + f" ORDER BY {order}" + (" LIMIT ?" if limit is not None else ""))
        return self.rows(sql, *given.values(), *(() if limit is None else (limit,)))

    # -- the lease -----------------------------------------------------------------

    def _holder(self) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (_LEASE,)).fetchone()
        return str(row[0]) if row is not None else None

    def _refuse_stale_owner(self) -> None:
        holder = self._holder()
        if holder != self.owner:
            raise StaleOwner(self.owner, holder)

    def _take_lease(self) -> None:
        """This handle's owner becomes the store's one writer (written only if it is
        not already)."""
        with self.reading(f"take the lease of {self.path}"):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if self._holder() != self.owner:
                    self._conn.execute(
                        "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key)"
                        " DO UPDATE SET value=excluded.value", (_LEASE, self.owner))
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise


def swap(c: sqlite3.Connection, table: str, key: dict[str, object], version: int,
         lost: str, **sets: object) -> None:
    """The compare-and-swap of a mutable record, inside the caller's transaction: `sets`
    written to the row of `key`, its version bumped, only while its version is still
    `version` (the one the caller read); `Conflict(lost)`, nothing written, otherwise."""
    assigned = "".join(f"{column}=?, " for column in sets)
    where = "".join(f"{column}=? AND " for column in key)
    cur = c.execute(f"UPDATE {table} SET {assigned}version=version+1 WHERE {where}version=?",
                    (*sets.values(), *key.values(), version))
    if cur.rowcount != 1:
        raise Conflict(lost)


def mark_removal(c: sqlite3.Connection, table: str, column: str, key_column: str,
                 key: str, removal: Removal, **sets: object) -> bool:
    """The durable intent of a removal (`column` of the row whose `key_column` is
    `key`), with the other columns `sets`, inside the caller's transaction. A purge
    asked once stays asked. False if there is no such row."""
    assigned = "".join(f" {name}=?," for name in sets)
    cur = c.execute(
        f"UPDATE {table} SET {column}=CASE WHEN {column}=? THEN {column} ELSE ? END,"
        f"{assigned} version=version+1 WHERE {key_column}=?",
        (Removal.PURGE_DATA.value, removal.value, *sets.values(), key))
    return cur.rowcount == 1


def is_foreign_key(exc: sqlite3.IntegrityError) -> bool:
    """Whether a foreign key refused the write (a record it names does not exist)."""
    return "FOREIGN KEY" in str(exc)


def _translated(what: str, missing: str | None, exc: BaseException,
                path: Path) -> StoreError:
    """The store's error for a driver's: a foreign key refused is a record not found, a
    unique index refused is a conflict, a full disk is `DiskFull`, anything else a
    `StoreError` naming what was being done."""
    if disk_full(exc):
        return DiskFull(f"{what}: write to the store", path)
    message = str(exc)
    if isinstance(exc, sqlite3.IntegrityError):
        if "FOREIGN KEY" in message:
            return NotFound(f"{what}: {missing or 'a record it names does not exist'}")
        if "UNIQUE" in message or "PRIMARY KEY" in message:
            taken = message.partition(": ")[2] or message
            return Conflict(f"{what}: {taken} is taken")
    return StoreError(f"{what}: {message}")


def _connect(path: Path) -> sqlite3.Connection:
    """The store's connection, its schema current; nothing is left open on failure."""
    _lay_down_private(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit survives power loss, not just a process crash; a transaction
        # in a deferred scope sets NORMAL for itself (Db.tx, keelway/durable.py).
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        schema.migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can only read the store at `path`."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                           isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=5000")
    except BaseException:
        conn.close()
        raise
    return conn


def _lay_down_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does, and narrow a store an older
    keelway left 0644 (with its side files), once, at open."""
    create_private(path)
    for candidate in (path, *sqlite_side_paths(path)):
        with contextlib.suppress(FileNotFoundError):
            if candidate.stat().st_mode & 0o077:
                os.chmod(candidate, PRIVATE_FILE_MODE)
