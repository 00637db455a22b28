"""The in-memory store: a second, real backend of the `Store` protocol, in plain Python.

What it is for: plan and runner tests that need records but no daemon and no file
(they build records through the protocol and read them back, in microseconds), and the
proof that the protocol is not SQLite-shaped: the contract suite in
tests/store/contract/ runs every test over this store and the SQLite one alike.

What it keeps, as the SQLite store does: each public method is atomic (a write takes a
snapshot of the tables and puts it back if it raises: keelway/testing/memory_tables.py),
lifecycle moves are checked by keelway.store.lifecycle.check, the host rule is
keelway/store/hosts.py's, errors are the store's (`StoreError` and its kinds, never a
KeyError), ids are allocated as SQLite's AUTOINCREMENT allocates them (monotonic, never
reused), and list reads come in the SQLite store's order.

What it does not promise: durability. Its records live as long as the `MemoryTables`
they are kept in; a `MemoryStore` opened again over the same tables is the same store
(as a restarted control plane opens the same file), but nothing survives the process.
It is not thread-safe: one writer, as one control plane is the only writer of its store.

Layout: one module per noun (memory_apps, memory_instances, memory_builds, memory_ops,
memory_routes, memory_imports, memory_generations, memory_local, memory_rollouts), each
over the shared tables; the intents that span nouns are keelway/store/intents.py's, the
same composition the SQLite store runs, inside one write of their own (a nested write
joins it), and the two that need this backend's own writes are here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import msgspec

from keelway.clock import Clock, SystemClock
from keelway.journal import Cause
from keelway.store import Store, intents
from keelway.store.lifecycle import RouteState
from keelway.store.records import CrashRetry, Release, ReleaseDraft
from keelway.testing.memory_apps import MemoryApps
from keelway.testing.memory_builds import MemoryBuilds
from keelway.testing.memory_generations import MemoryGenerations
from keelway.testing.memory_imports import MemoryImports
from keelway.testing.memory_instances import MemoryInstances
from keelway.testing.memory_local import MemoryLocal
from keelway.testing.memory_ops import MemoryOps
from keelway.testing.memory_rollouts import MemoryRollouts
from keelway.testing.memory_routes import MemoryRoutes, put_route
from keelway.testing.memory_tables import MemoryDb, MemoryTables

__all__ = ["BOX", "MemoryStore", "MemoryTables"]

T = TypeVar("T")

# The owner token of a memory store opened without one: one fixed token, as one box has.
BOX = "box:memory"


class MemoryStore:
    """The whole store in memory: one attribute per noun, the cross-noun intents here."""

    def __init__(self, clock: Clock | None = None, tables: MemoryTables | None = None, *,
                 owner: str | None = None) -> None:
        """A store over `tables` (new ones if None) opened by the writer `owner` (None:
        this box's one token, so a box never refuses itself); opening takes the lease."""
        self.clock: Clock = clock or SystemClock()
        self.tables = tables if tables is not None else MemoryTables()
        self._db = MemoryDb(self.tables, self.clock, owner if owner is not None else BOX)
        self.apps = MemoryApps(self._db)
        self.instances = MemoryInstances(self._db)
        self.builds = MemoryBuilds(self._db)
        self.ops = MemoryOps(self._db)
        self.routes = MemoryRoutes(self._db)
        self.imports = MemoryImports(self._db)
        self.generations = MemoryGenerations(self._db)
        self.local = MemoryLocal(self._db)
        self.rollouts = MemoryRollouts(self._db)

    def reopen(self, owner: str | None = None) -> MemoryStore:
        """The same records opened again, as a restarted control plane opens its store."""
        return MemoryStore(self.clock, self.tables, owner=owner)

    # The intents composed over the nouns, one implementation for every backend
    # (keelway/store/intents.py); each runs inside `writing`.
    plan_generation = intents.plan_generation
    record_spawn = intents.record_spawn
    record_gone = intents.record_gone
    install = intents.install
    activate_and_route = intents.activate_and_route
    fall_back = intents.fall_back
    take_out_of_service = intents.take_out_of_service
    park = intents.park
    begin_with = intents.begin_with
    finish_with = intents.finish_with
    defer_releases = intents.defer_releases

    def writing(self, what: str) -> AbstractContextManager[object]:
        return self._db.write()

    async def sync(self) -> None:
        """Nothing to make durable: the tables live and die with the process."""

    async def read_aside(self, read: Callable[..., T], *args: Any) -> T:
        """In place, as `read_apart`."""
        return read(self, *args)

    async def read_apart(self, read: Callable[[Store], T]) -> T:
        """In place, on the caller's loop: the tables are not for another thread, and
        nothing writes them while `read` runs, so it is one consistent picture too."""
        return read(self)

    def close(self) -> None:
        """Nothing to release: the records stay in `tables` for a reopen."""

    # -- what an operation installs or puts back ---------------------------------------

    def defer_release(self, instance: str, *, schedule_rev: int, number: int, cause: Cause,
                      release: ReleaseDraft | None) -> Release | None:
        """Release `number` pending on a parked instance, the release row written when
        `release` is given, in one write; `StaleSchedule` as `install`."""
        with self._db.write() as t:
            intents.scheduled(self, instance, schedule_rev)
            written = intents.write_release(self, release)
            if written is not None:
                number = written.number
            inst = t.instances[instance]
            # A release still pending keeps its cause: a config change on top of a
            # deferred release runs a new build all the same, and must fall back as one.
            kept = (inst.pending_cause if inst.pending_release is not None
                    and inst.pending_cause is Cause.RELEASE else cause)
            t.instances[instance] = msgspec.structs.replace(
                inst, pending_release=number, pending_cause=kept, version=inst.version + 1)
        return written

    def clear_pending(self, instance: str, number: int) -> None:
        with self._db.write() as t:
            inst = t.instances.get(instance)
            if inst is not None and inst.pending_release == number:
                t.instances[instance] = msgspec.structs.replace(
                    inst, pending_release=None, pending_cause=None, version=inst.version + 1)

    def record_crash(self, retry: CrashRetry, *, gate_waiting: bool = False) -> bool:
        """The crash and its retry time, and the route that served the crashed web (with
        `gate_waiting`, a parked or holding one too) gated, in one write."""
        with self._db.write() as t:
            t.backoff[(retry.instance, retry.service)] = retry
            route = t.routes.get(retry.instance)
            gate = (retry.service == "web" and route is not None
                    and ((route.state is RouteState.SERVING
                          and route.generation_id == retry.generation_id)
                         or (gate_waiting and route.state in (RouteState.PARKED,
                                                              RouteState.HOLDING))))
            if gate:
                put_route(t, retry.instance, RouteState.GATED, None, None)
        return gate

    # -- inside an intent's write --------------------------------------------------------

def _is_a_store(clock: Clock | None = None) -> Store:
    """mypy's proof that a `MemoryStore` is a `Store` (every noun, every intent)."""
    return MemoryStore(clock)
