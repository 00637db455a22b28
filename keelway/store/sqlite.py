"""The SQLite store: every durable record of keelway in one embedded file.

It implements `Store` (keelway/store/store.py) by composition: one class per noun
(keelway/store/{apps,instances,builds,operations,routes,imports,generations,local,
rollouts}.py),
each over the one shared connection (`Db`, keelway/store/db.py), held here as
`store.apps`, `store.instances`, ... The rules:
- Each public method is one BEGIN IMMEDIATE transaction (`Db.tx()`), so a write happens
  whole or not at all, across a SIGKILL at any instruction. `tx()` is not part of the
  protocol: no caller outside this package opens one (tests/store/test_boundary.py).
- The intents that span nouns compose the nouns' writes inside one transaction, where
  each noun's `tx()` joins the outer one: most are written once for every backend
  (keelway/store/intents.py, run inside `writing`); the ones that need this backend's
  own writes (a crash retry and its gate, a deferred release) are here.
- Lifecycle moves are checked (keelway.store.lifecycle.check) where they are written.
- Every write checks the owner's lease inside its transaction (`Db`): a handle whose
  lease another took writes nothing (`StaleOwner`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar, cast

from keelway.clock import Clock
from keelway.journal import Cause
from keelway.store import intents
from keelway.store.apps import SqliteApps
from keelway.store.aside import ASIDE_FROM, Aside, AsideUnavailable
from keelway.store.builds import SqliteBuilds
from keelway.store.db import Db
from keelway.store.generations import SqliteGenerations
from keelway.store.imports import SqliteImports
from keelway.store.instances import SqliteInstances
from keelway.store.lifecycle import RouteState
from keelway.store.local import SqliteLocal
from keelway.store.operations import SqliteOperations
from keelway.store.records import CrashRetry, Release, ReleaseDraft
from keelway.store.rollouts import SqliteRollouts
from keelway.store.routes import SqliteRoutes
from keelway.store.store import Store

log = logging.getLogger("keelway.store")

T = TypeVar("T")


class SqliteStore:
    """The whole store on one SQLite connection, opened by the writer `owner` (by
    default the one token of this box: `keelway.store.db.box_owner`)."""

    def __init__(self, path: Path, clock: Clock | None = None, *,
                 owner: str | None = None, read_only: bool = False) -> None:
        """`read_only`: a reader of a store its writer has opened (`Db`)."""
        self.db = Db(path, clock, owner, read_only=read_only)
        # Read-only connections of `read_apart`, one per worker thread that read (a
        # connection is for one thread at a time): reads apart run side by side, a
        # periodic pass's survey beside a `status`.
        self._readers: list[SqliteStore] = []
        self._mine = threading.local()
        self._aside: Aside | None = None
        self._reading = threading.Lock()
        self._syncing = asyncio.Lock()
        self.path = self.db.path
        self.clock = self.db.clock
        self.apps = SqliteApps(self.db)
        self.builds = SqliteBuilds(self.db)
        self.ops = SqliteOperations(self.db)
        self.routes = SqliteRoutes(self.db)
        self.imports = SqliteImports(self.db)
        self.generations = SqliteGenerations(self.db)
        self.local = SqliteLocal(self.db)
        self.rollouts = SqliteRollouts(self.db)
        self.instances = SqliteInstances(self.db, ops=self.ops, generations=self.generations,
                                         routes=self.routes)

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
        return self.db.tx(what)

    def close(self) -> None:
        if self._aside is not None:
            self._aside.close()
        with self._reading:
            for reader in self._readers:
                reader.close()
            self._readers.clear()
        self.db.close()

    async def sync(self) -> None:
        """Every commit made before the call on disk when it returns (keelway/durable.py):
        the WAL fsynced in a worker thread, one fsync for every caller waiting at once
        (a group commit: a cohort's operations ending together share it)."""
        want = self.db.committed
        async with self._syncing:
            if self.db.synced >= want:
                return
            upto = self.db.committed
            await asyncio.to_thread(self.db.fsync_log)
            self.db.synced = max(self.db.synced, upto)

    async def read_aside(self, read: Callable[..., T], *args: Any) -> T:
        """`read(store, *args)` in a process of its own (keelway/store/aside.py), over
        one snapshot, once the store holds ASIDE_FROM instances; in a thread
        (`read_apart`) below that, or where that process cannot run."""
        counted = self.db.row("SELECT COUNT(*) FROM instances")
        if counted is None or counted[0] < ASIDE_FROM:
            return await self.read_apart(lambda store: read(store, *args))
        if self._aside is None:
            self._aside = Aside(self.path)
        try:
            return cast(T, await asyncio.to_thread(self._aside.call, read, args))
        except AsideUnavailable as exc:
            log.warning("%s; reading in a thread instead", exc)
            return await self.read_apart(lambda store: read(store, *args))

    async def read_apart(self, read: Callable[[Store], T]) -> T:
        """`read` run in a worker thread over a read-only connection of its own, inside
        one read transaction: a consistent picture that costs the event loop (which
        commits every journal write) nothing while it is read."""
        return await asyncio.to_thread(self._read_snapshot, read)

    def _read_snapshot(self, read: Callable[[Store], T]) -> T:
        reader: SqliteStore | None = getattr(self._mine, "reader", None)
        if reader is None:
            reader = SqliteStore(self.path, self.clock, read_only=True)
            with self._reading:
                self._readers.append(reader)
            self._mine.reader = reader
        with reader.db.snapshot():
            return read(reader)

    def defer_release(self, instance: str, *, schedule_rev: int, number: int, cause: Cause,
                      release: ReleaseDraft | None) -> Release | None:
        """Release `number` pending on a parked `instance`, the release row written when
        `release` is given, in one write; compare-and-swap on the schedule revision, as
        `install` does, so a superseded rollout defers nothing. The instance's route and
        processes are untouched: it stays parked until a request wakes it."""
        with self.db.tx(f"defer a release on {instance}"):
            intents.scheduled(self, instance, schedule_rev)
            written = intents.write_release(self, release)
            if written is not None:
                number = written.number
            self.instances.set_pending(instance, number, cause)
        return written

    def clear_pending(self, instance: str, number: int) -> None:
        self.instances.clear_pending(instance, number)

    def record_crash(self, retry: CrashRetry, *, gate_waiting: bool = False) -> bool:
        """Persist a crash and when its restart is due (one row per instance+service),
        and gate, in the same write, a route that served the crashed generation: a route
        never stays on the port of a process recorded dead. True if it gated one.
        `gate_waiting`: the caller is the operation whose route waits for this web (a
        wake's `parked`, a restore's `holding`), whose start failed: that route is gated
        too, so requests get 503 + Retry-After instead of waiting for a web that will not
        come before the retry.

        Crash before the write: boot restarts the service at once. Crash after: boot
        waits for the recorded retry time, the route gated until the restart publishes."""
        with self.db.tx(f"record a crash of {retry.service} on {retry.instance}") as c:
            self.generations.save_crash_retry(retry)
            route = self.routes.get_route(retry.instance)
            gate = (retry.service == "web" and route is not None
                    and ((route.state is RouteState.SERVING
                          and route.generation_id == retry.generation_id)
                         or (gate_waiting and route.state in (RouteState.PARKED,
                                                              RouteState.HOLDING))))
            if gate:
                self.routes.put(c, retry.instance, RouteState.GATED, None, None)
        return gate
