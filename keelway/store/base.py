"""The store's foundation: one SQLite connection, transactions, query helpers, errors.

The rules the whole store keeps are in keelway/store/store.py; `tx()` is how it keeps
the first of them.

The database holds config values, so it is created 0600 before SQLite opens it: SQLite
gives its `-wal` and `-shm` the database's mode, so all three are private from the start.

A full disk (SQLITE_FULL, ENOSPC) fails the one transaction that met it: it is rolled
back, whatever SQLite did on its own, and `DiskFull` says so. The connection stays usable,
so the store works again as soon as there is room, with nothing to reopen.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keelway.clock import Clock, SystemClock
from keelway.durable import PRIVATE_FILE_MODE, SQLITE_SIDE_FILES, create_private, disk_full
from keelway.store import schema


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption): not the caller's fault."""


class Conflict(StoreError):
    """A compare-and-swap lost: someone else changed the record first."""


class StaleSchedule(Conflict):
    """The instance's schedule revision moved past the caller's: a newer intent owns it."""


class NotFound(StoreError):
    pass


class DiskFull(StoreError):
    """A write met a full disk and was rolled back whole; retry once there is room."""

    def __init__(self, what: str, path: Path) -> None:
        super().__init__(f"{what} {path}: the disk is full")
        self.filename = str(path)  # as an OSError names it, for durable.disk_full_message


class StoreBase:
    """The connection, transactions and query helpers every part of the store shares."""

    def __init__(self, path: Path, clock: Clock | None = None) -> None:
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self._depth = 0
        try:
            self._conn = _connect(self.path)
        except BaseException as exc:
            if disk_full(exc):
                raise DiskFull("open the store", self.path) from exc
            raise

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction; nested calls join the outer one. Only the
        store's own methods open one: it is not part of the `Store` protocol."""
        if self._depth:
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self._conn
            self._conn.execute("COMMIT")
        except BaseException as exc:
            # A COMMIT that fails (SQLITE_FULL) may or may not have rolled back by
            # itself; either way no transaction may stay open, or every later BEGIN
            # would fail long after the disk has room again.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if disk_full(exc) and not isinstance(exc, DiskFull):
                raise DiskFull("write to the store", self.path) from exc
            raise
        finally:
            self._depth = 0

    def _one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._conn.execute(sql, args).fetchone()
        return row

    def _all(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return list(self._conn.execute(sql, args).fetchall())

    # -- meta ------------------------------------------------------------------------

    def next_route_table_version(self, at_least: int = 0) -> int:
        """Bump and return the route table version (never below `at_least` + 1)."""
        with self.tx() as c:
            row = self._one("SELECT value FROM meta WHERE key='route_table_version'")
            current = int(row["value"]) if row else 0
            new = max(current, at_least) + 1
            c.execute(
                "INSERT INTO meta(key, value) VALUES ('route_table_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(new),),
            )
        return new


def _connect(path: Path) -> sqlite3.Connection:
    """The store's connection, its schema current; nothing is left open on failure."""
    _lay_down_private(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed operation step survives power loss, not just a process crash.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        schema.migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _lay_down_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does, and narrow a store an older
    keelway left 0644 (with its side files), once, at open."""
    create_private(path)
    for candidate in (path, *(path.with_name(path.name + s) for s in SQLITE_SIDE_FILES)):
        with contextlib.suppress(FileNotFoundError):
            if candidate.stat().st_mode & 0o077:
                os.chmod(candidate, PRIVATE_FILE_MODE)
