"""The store's foundation: one SQLite connection, transactions, query helpers, errors.

The rules the whole store keeps are in keelway/store/store.py; `tx()` is how it keeps
the first of them.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keelway.clock import Clock, SystemClock
from keelway.store import schema


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption): not the caller's fault."""


class Conflict(StoreError):
    """A compare-and-swap lost: someone else changed the record first."""


class NotFound(StoreError):
    pass


class StoreBase:
    """The connection, transactions and query helpers every part of the store shares."""

    def __init__(self, path: Path, clock: Clock | None = None) -> None:
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed operation step survives power loss, not just a process crash.
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._depth = 0
        schema.migrate(self._conn)

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction; nested calls join the outer one."""
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
        except BaseException:
            self._depth = 0
            self._conn.execute("ROLLBACK")
            raise
        self._depth = 0
        self._conn.execute("COMMIT")

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
