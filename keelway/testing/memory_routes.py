"""The in-memory store's routes (RouteStore), and the two rules every write of a route
keeps, whichever noun writes it: an alias's row mirrors its instance's primary row
(`mirror_aliases`), and an intent's own write of a host's row (`put_route`)."""

from __future__ import annotations

import msgspec

from keelway.store.errors import Conflict
from keelway.store.lifecycle import RouteState, check
from keelway.store.records import Route
from keelway.testing.memory_tables import MemoryDb, MemoryTables


class MemoryRoutes:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def set_route(self, host: str, instance: str, state: RouteState, port: int | None,
                  generation_id: int | None, *, expected: Route | None) -> Route:
        with self._db.write() as t:
            have = t.routes.get(host)
            if expected is None:
                if have is not None:
                    raise Conflict(f"the route of {host} was written under us")
                t.routes[host] = Route(host, instance, state, port, generation_id, 1)
            else:
                check(expected.state, state)
                if have is None or have.version != expected.version:
                    raise Conflict(f"the route of {host} changed under us")
                t.routes[host] = Route(host, instance, state, port, generation_id,
                                       have.version + 1)
            if host == instance:  # an instance's own row: its aliases say the same
                mirror_aliases(t, instance)
            return t.routes[host]

    def get_route(self, host: str) -> Route | None:
        return self._db.tables.routes.get(host)

    def list_routes(self) -> list[Route]:
        return [r for _, r in sorted(self._db.tables.routes.items())]

    def next_route_table_version(self, at_least: int = 0) -> int:
        with self._db.write() as t:
            t.route_table_version = max(t.route_table_version, at_least) + 1
            return t.route_table_version


def put_route(t: MemoryTables, host: str, state: RouteState, port: int | None,
              generation_id: int | None) -> None:
    """A host's own route, inside an intent's write (its import seed, if any, stays)."""
    have = t.routes.get(host)
    t.routes[host] = Route(host, host, state, port, generation_id,
                           have.version + 1 if have else 1)
    mirror_aliases(t, host)


def delete_route(t: MemoryTables, host: str) -> None:
    t.routes.pop(host, None)
    t.route_seeds.pop(host, None)


def mirror_aliases(t: MemoryTables, instance: str) -> None:
    """Every alias route of `instance` says what its primary row says; with no primary
    row, its aliases have none. A row already right is not rewritten (its version
    stays), as SQLite's upsert with its WHERE leaves it."""
    primary = t.routes.get(instance)
    for alias in [a for a in t.aliases.values() if a.instance == instance]:
        if primary is None:
            delete_route(t, alias.host)
            continue
        have = t.routes.get(alias.host)
        if have is None:
            t.routes[alias.host] = Route(alias.host, alias.instance, primary.state,
                                         primary.port, primary.generation_id, 1)
        elif (have.state, have.port, have.generation_id) != (
                primary.state, primary.port, primary.generation_id):
            t.routes[alias.host] = msgspec.structs.replace(
                have, state=primary.state, port=primary.port,
                generation_id=primary.generation_id, version=have.version + 1)
