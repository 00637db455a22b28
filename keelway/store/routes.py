"""The SQLite store's routes: what each host is served by, each write mirrored to the
instance's aliases (keelway/store/hosts.py), and the route table's version."""

from __future__ import annotations

import sqlite3

from keelway.store.db import Db, swap
from keelway.store.errors import Conflict
from keelway.store.hosts import mirror_aliases
from keelway.store.lifecycle import RouteState, check
from keelway.store.records import Route


class SqliteRoutes:
    """Routes and the route table version (`RouteStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def set_route(
        self, host: str, instance: str, state: RouteState, port: int | None,
        generation_id: int | None, *, expected: Route | None,
    ) -> Route:
        """Write a host's route. `expected` is the route the caller read (None: there
        was none); `Conflict` if it changed since."""
        with self.db.tx(f"set the route of {host}") as c:
            if expected is None:
                try:
                    c.execute("INSERT INTO routes(host, instance, state, port, generation_id)"
                              " VALUES (?, ?, ?, ?, ?)",
                              (host, instance, state.value, port, generation_id))
                except sqlite3.IntegrityError as exc:
                    raise Conflict(f"the route of {host} was written under us") from exc
            else:
                check(expected.state, state)
                swap(c, "routes", {"host": host}, expected.version,
                     f"the route of {host} changed under us", instance=instance,
                     state=state.value, port=port, generation_id=generation_id)
            if host == instance:  # an instance's own row: its aliases say the same
                mirror_aliases(c, instance)
        route = self.get_route(host)
        assert route is not None
        return route

    def put(self, c: sqlite3.Connection, host: str, state: RouteState,
            port: int | None, generation_id: int | None) -> None:
        """A host's own route, inside an intent's transaction."""
        c.execute(
            "INSERT INTO routes(host, instance, state, port, generation_id)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT(host) DO UPDATE SET"
            " instance=excluded.instance, state=excluded.state, port=excluded.port,"
            " generation_id=excluded.generation_id, version=routes.version+1",
            (host, host, state.value, port, generation_id),
        )
        mirror_aliases(c, host)

    def get_route(self, host: str) -> Route | None:
        row = self.db.row("SELECT * FROM routes WHERE host=?", host)
        return _route(row) if row else None

    def list_routes(self) -> list[Route]:
        return [_route(r) for r in self.db.rows("SELECT * FROM routes ORDER BY host")]

    def next_route_table_version(self, at_least: int = 0) -> int:
        """Bump and return the route table version (never below `at_least` + 1)."""
        with self.db.tx("bump the route table version") as c:
            row = self.db.row("SELECT value FROM meta WHERE key='route_table_version'")
            current = int(row["value"]) if row else 0
            new = max(current, at_least) + 1
            c.execute(
                "INSERT INTO meta(key, value) VALUES ('route_table_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(new),),
            )
        return new


def _route(r: sqlite3.Row) -> Route:
    return Route(r["host"], r["instance"], RouteState(r["state"]), r["port"],
                 r["generation_id"], r["version"])
