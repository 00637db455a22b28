"""The SQLite store: every durable record of keelway in one embedded file.

It implements `Store` (keelway/store/store.py) by composition: one class per noun
(keelway/store/{apps,instances,builds,operations,routes,imports,generations,local}.py),
each over the one shared connection (`Db`, keelway/store/db.py), held here as
`store.apps`, `store.instances`, ... The rules:
- Each public method is one BEGIN IMMEDIATE transaction (`Db.tx()`), so a write happens
  whole or not at all, across a SIGKILL at any instruction. `tx()` is not part of the
  protocol: no caller outside this package opens one (tests/store/test_boundary.py).
- The intents that span nouns (an install, a fall-back, a crash recorded) live here and
  compose the nouns' writes inside their own transaction, where each noun's `tx()`
  joins the outer one.
- Lifecycle moves are checked (keelway.store.lifecycle.check) where they are written.
- Every write checks the owner's lease inside its transaction (`Db`): a handle whose
  lease another took writes nothing (`StaleOwner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from keelway.clock import Clock
from keelway.journal import Cause, Inhibition
from keelway.store.apps import SqliteApps
from keelway.store.builds import SqliteBuilds
from keelway.store.db import Db
from keelway.store.errors import NotFound, StaleSchedule
from keelway.store.generations import SqliteGenerations
from keelway.store.imports import SqliteImports
from keelway.store.instances import SqliteInstances
from keelway.store.lifecycle import GenState, InstanceState, RouteState
from keelway.store.local import SqliteLocal
from keelway.store.operations import SqliteOperations
from keelway.store.records import CrashRetry, Generation, Instance, Release, ReleaseDraft
from keelway.store.routes import SqliteRoutes


class SqliteStore:
    """The whole store on one SQLite connection, opened by the writer `owner` (by
    default the one token of this box: `keelway.store.db.box_owner`)."""

    def __init__(self, path: Path, clock: Clock | None = None, *,
                 owner: str | None = None) -> None:
        self.db = Db(path, clock, owner)
        self.path = self.db.path
        self.clock = self.db.clock
        self.apps = SqliteApps(self.db)
        self.builds = SqliteBuilds(self.db)
        self.ops = SqliteOperations(self.db)
        self.routes = SqliteRoutes(self.db)
        self.imports = SqliteImports(self.db)
        self.generations = SqliteGenerations(self.db)
        self.local = SqliteLocal(self.db, self.generations)
        self.instances = SqliteInstances(self.db, ops=self.ops, generations=self.generations,
                                         routes=self.routes)

    def close(self) -> None:
        self.db.close()

    def install(
        self, instance: str, *, schedule_rev: int, candidates: Mapping[str, Generation],
        retiring: Iterable[int], retire_reason: Inhibition, op_id: int,
        release: ReleaseDraft | None,
    ) -> Release | None:
        """Make `candidates` what `instance` runs, in one write: the release row (when
        `release` is given, with the app's config), ACTIVE, the `retire_reason` mark on
        each generation `retiring`, the route to the web candidate, the instance RUNNING.

        It compares and swaps on the instance's schedule revision: `StaleSchedule` if a
        newer intent moved it past `schedule_rev`, and then nothing is written. So ACTIVE
        never names a release that has no row, and a superseded attempt installs nothing.
        """
        with self.db.tx(f"install on {instance}"):
            inst = self.instances.get_instance(instance)
            if inst is None or inst.schedule_rev != schedule_rev:
                raise StaleSchedule(f"{instance} was rescheduled past revision {schedule_rev}")
            written = self._write_release(release)
            for service, gen in candidates.items():
                self.generations.set_active(
                    instance, service, gen.id,
                    expected=self.generations.get_active(instance, service))
            for gen_id in retiring:
                self.generations.add_inhibition(gen_id, retire_reason, op_id)
            web = candidates.get("web")
            if web is not None:
                self.routes.set_route(instance, instance, RouteState.SERVING, web.port, web.id,
                                      expected=self.routes.get_route(instance))
            if inst.state is not InstanceState.RUNNING:
                self.instances.set_instance_state(inst, InstanceState.RUNNING)
            if inst.pending_release is not None:
                # What is installed now supersedes a release deferred to a wake.
                self.instances.clear_pending(instance, inst.pending_release)
        return written

    def defer_release(self, instance: str, *, schedule_rev: int, number: int, cause: Cause,
                      release: ReleaseDraft | None) -> Release | None:
        """Release `number` pending on a parked `instance`, the release row written when
        `release` is given, in one write; compare-and-swap on the schedule revision, as
        `install` does, so a superseded rollout defers nothing. The instance's route and
        processes are untouched: it stays parked until a request wakes it."""
        with self.db.tx(f"defer a release on {instance}"):
            inst = self.instances.get_instance(instance)
            if inst is None or inst.schedule_rev != schedule_rev:
                raise StaleSchedule(f"{instance} was rescheduled past revision {schedule_rev}")
            written = self._write_release(release)
            if written is not None:
                number = written.number
            self.instances.set_pending(instance, number, cause)
        return written

    def _write_release(self, release: ReleaseDraft | None) -> Release | None:
        """The release row of an install or a deferral, with its config made the
        app's, inside the intent's transaction."""
        if release is None:
            return None
        written = self.builds.create_release(release.app, release.build_digest,
                                             release.config, release.description)
        app = self.apps.get_app(release.app)
        if app is not None and app.config != release.config:
            self.apps.set_app_config(app, release.config)
        return written

    def clear_pending(self, instance: str, number: int) -> None:
        self.instances.clear_pending(instance, number)

    def activate_and_route(self, instance: str, generations: Mapping[str, int]) -> None:
        """Name `generations` ACTIVE (service -> generation id) and, in the same write,
        route the instance to its ACTIVE web if that one is not gone: the route never
        names a web generation that ACTIVE does not."""
        with self.db.tx(f"activate and route {instance}"):
            for service, gen_id in generations.items():
                self.generations.set_active(
                    instance, service, gen_id,
                    expected=self.generations.get_active(instance, service))
            web_active = self.generations.get_active(instance, "web")
            web = (self.generations.get_generation(web_active.generation_id)
                   if web_active else None)
            if web is not None and web.state is not GenState.GONE:
                self.routes.set_route(instance, instance, RouteState.SERVING, web.port, web.id,
                                      expected=self.routes.get_route(instance))

    def fall_back(
        self, instance: str, *, active: Mapping[str, int], unmark: Iterable[int],
        unmark_reason: Inhibition, web: Generation | None,
    ) -> bool:
        """Put back what a failed attempt replaced, in one write: `active` (service ->
        generation id) ACTIVE again, the `unmark_reason` mark off each of `unmark`, and
        the route to `web` (gated when None). True if the route changed.

        A route already right is left untouched (the journal shows the failure, nothing
        else); an instance that never had a route and has no web gets none."""
        with self.db.tx(f"fall back on {instance}"):
            for service, gen_id in active.items():
                self.generations.set_active(
                    instance, service, gen_id,
                    expected=self.generations.get_active(instance, service))
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
        """Put the instance in `state` (why: `reason`) and gate its route, in one write.
        True if the route changed, so the caller publishes.

        One write, because the two halves mean one thing: an instance not RUNNING whose
        route still served would take traffic that nothing restarts (invariant 2), and
        a gated route on a RUNNING instance would look like a fault to the reconciler.
        `NotFound` if there is no such instance."""
        with self.db.tx(f"take {instance} out of service"):
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
        """The instance PARKED and its route (if it has one) `parked`, with no upstream,
        in one write; compare-and-swap on `inst.version`. So the router is never told to
        hold a host whose instance is recorded running, nor to serve one recorded parked."""
        with self.db.tx(f"park {inst.host}"):
            parked = self.instances.set_instance_state(inst, InstanceState.PARKED)
            route = self.routes.get_route(inst.host)
            if route is not None and route.state is not RouteState.PARKED:
                self.routes.set_route(inst.host, inst.host, RouteState.PARKED, None, None,
                                      expected=route)
        return parked

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
