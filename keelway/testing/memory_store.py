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
memory_routes, memory_imports, memory_generations, memory_local), each over the shared
tables; the intents that span nouns are here, composing the nouns' writes inside one
write of their own (a nested write joins it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from keelway.clock import Clock, SystemClock
from keelway.journal import Cause, Inhibition
from keelway.store import Store
from keelway.store.errors import NotFound, StaleSchedule
from keelway.store.lifecycle import GenState, InstanceState, RouteState
from keelway.store.records import CrashRetry, Generation, Instance, Release, ReleaseDraft
from keelway.testing.memory_apps import MemoryApps
from keelway.testing.memory_builds import MemoryBuilds
from keelway.testing.memory_generations import MemoryGenerations
from keelway.testing.memory_imports import MemoryImports
from keelway.testing.memory_instances import MemoryInstances
from keelway.testing.memory_local import MemoryLocal
from keelway.testing.memory_ops import MemoryOps
from keelway.testing.memory_routes import MemoryRoutes, put_route
from keelway.testing.memory_tables import MemoryDb, MemoryTables

__all__ = ["BOX", "MemoryStore", "MemoryTables"]

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

    def reopen(self, owner: str | None = None) -> MemoryStore:
        """The same records opened again, as a restarted control plane opens its store."""
        return MemoryStore(self.clock, self.tables, owner=owner)

    def close(self) -> None:
        """Nothing to release: the records stay in `tables` for a reopen."""

    # -- what an operation installs or puts back ---------------------------------------

    def install(self, instance: str, *, schedule_rev: int,
                candidates: Mapping[str, Generation], retiring: Iterable[int],
                retire_reason: Inhibition, op_id: int,
                release: ReleaseDraft | None) -> Release | None:
        """Release row, ACTIVE, retirement marks, route and instance RUNNING in one
        write; `StaleSchedule` (nothing written) if the schedule moved past
        `schedule_rev`."""
        with self._db.write():
            inst = self._scheduled(instance, schedule_rev)
            written = self._write_release(release)
            for service, gen in candidates.items():
                self.generations.set_active(instance, service, gen.id,
                                            expected=self.generations.get_active(instance,
                                                                                 service))
            for gen_id in retiring:
                self.generations.add_inhibition(gen_id, retire_reason, op_id)
            web = candidates.get("web")
            if web is not None:
                self.routes.set_route(instance, instance, RouteState.SERVING, web.port,
                                      web.id, expected=self.routes.get_route(instance))
            if inst.state is not InstanceState.RUNNING:
                inst = self.instances.set_instance_state(inst, InstanceState.RUNNING)
            if inst.pending_release is not None:
                # What is installed now supersedes a release deferred to a wake.
                self.clear_pending(instance, inst.pending_release)
        return written

    def defer_release(self, instance: str, *, schedule_rev: int, number: int, cause: Cause,
                      release: ReleaseDraft | None) -> Release | None:
        """Release `number` pending on a parked instance, the release row written when
        `release` is given, in one write; `StaleSchedule` as `install`."""
        with self._db.write() as t:
            self._scheduled(instance, schedule_rev)
            written = self._write_release(release)
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

    def activate_and_route(self, instance: str, generations: Mapping[str, int]) -> None:
        """ACTIVE for `generations`, and the route to the ACTIVE web if it is not gone."""
        with self._db.write():
            for service, gen_id in generations.items():
                self.generations.set_active(instance, service, gen_id,
                                            expected=self.generations.get_active(instance,
                                                                                 service))
            web_active = self.generations.get_active(instance, "web")
            web = (self.generations.get_generation(web_active.generation_id)
                   if web_active else None)
            if web is not None and web.state is not GenState.GONE:
                self.routes.set_route(instance, instance, RouteState.SERVING, web.port,
                                      web.id, expected=self.routes.get_route(instance))

    def fall_back(self, instance: str, *, active: Mapping[str, int], unmark: Iterable[int],
                  unmark_reason: Inhibition, web: Generation | None) -> bool:
        """Put back ACTIVE, lift marks, route to `web` (gated if None), in one write.
        A route already right is left untouched; no route and no web stays no route."""
        with self._db.write():
            for service, gen_id in active.items():
                self.generations.set_active(instance, service, gen_id,
                                            expected=self.generations.get_active(instance,
                                                                                 service))
            for gen_id in unmark:
                self.generations.remove_inhibition(gen_id, unmark_reason)
            route = self.routes.get_route(instance)
            want: tuple[RouteState, int | None, int | None] = (
                (RouteState.SERVING, web.port, web.id) if web is not None
                else (RouteState.GATED, None, None))
            have = (route.state, route.port, route.generation_id) if route else None
            changed = have != want and (route is not None or web is not None)
            if changed:
                self.routes.set_route(instance, instance, *want, expected=route)
        return changed

    def take_out_of_service(self, instance: str, state: InstanceState,
                            reason: str | None = None) -> bool:
        """The instance in `state` and its route gated, in one write; True if the route
        changed. `NotFound` if there is no such instance."""
        with self._db.write():
            inst = self.instances.get_instance(instance)
            if inst is None:
                raise NotFound(f"no instance {instance}")
            if inst.state is not state or inst.down_reason != reason:
                self.instances.set_instance_state(inst, state, reason)
            route = self.routes.get_route(instance)
            if route is None or route.state is RouteState.GATED:
                return False
            self.routes.set_route(instance, instance, RouteState.GATED, None, None,
                                  expected=route)
            return True

    def park(self, inst: Instance) -> Instance:
        """The instance PARKED and its route `parked` (no upstream) in one write;
        compare-and-swap on `inst.version`, the move checked."""
        with self._db.write():
            parked = self.instances.set_instance_state(inst, InstanceState.PARKED)
            route = self.routes.get_route(inst.host)
            if route is not None and route.state is not RouteState.PARKED:
                self.routes.set_route(inst.host, inst.host, RouteState.PARKED, None, None,
                                      expected=route)
        return parked

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

    def _scheduled(self, instance: str, schedule_rev: int) -> Instance:
        inst = self.instances.get_instance(instance)
        if inst is None or inst.schedule_rev != schedule_rev:
            raise StaleSchedule(f"{instance} was rescheduled past revision {schedule_rev}")
        return inst

    def _write_release(self, release: ReleaseDraft | None) -> Release | None:
        if release is None:
            return None
        written = self.builds.create_release(release.app, release.build_digest,
                                             release.config, release.description)
        app = self.apps.get_app(release.app)
        if app is not None and app.config != release.config:
            self.apps.set_app_config(app, release.config)
        return written


def _is_a_store(clock: Clock | None = None) -> Store:
    """mypy's proof that a `MemoryStore` is a `Store` (every noun, every intent)."""
    return MemoryStore(clock)
