"""The SQLite store: every durable record of keelway in one embedded file.

It implements the `Store` protocol (keelway/store/store.py) and keeps its rules:
- Each public method is one BEGIN IMMEDIATE transaction (`tx()`), so a write happens
  whole or not at all, across a SIGKILL at any instruction. `tx()` is not part of the
  protocol: no caller outside this package opens one (tests/store/test_boundary.py).
- The row-level writes live in the per-noun parts (catalog, journal, processes); the
  intents that span nouns (an install, a fall-back) live here and compose those writes
  inside their own transaction, where a nested `tx()` joins the outer one.
- Lifecycle moves are checked (keelway.store.lifecycle.check) where they are written.

Shape, and why it is not a composed facade: the parts are disjoint method sets over the
one connection of StoreBase. Each is typed against StoreBase alone, so mypy refuses a
part that calls another; only this class, which sees them all, composes them, and only
into intents. Callers never see the split: they hold a `Store`, whose protocol is the
one list of intents. A facade over composed parts would restate every intent a third
time (protocol, facade, part) to forward it, and a reader would follow two hops to the
SQL instead of one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from keelway.journal import Cause, Inhibition
from keelway.store.base import NotFound, StaleSchedule
from keelway.store.catalog import Catalog
from keelway.store.fences import Fences
from keelway.store.identities import Identities
from keelway.store.journal import Journal
from keelway.store.lifecycle import GenState, InstanceState, RouteState
from keelway.store.processes import Processes
from keelway.store.records import Generation, Instance, InstanceView, Release, ReleaseDraft
from keelway.store.seeds import Seeds
from keelway.store.tenancy import Tenancy


class SqliteStore(Catalog, Journal, Processes, Fences, Tenancy, Seeds, Identities):
    """The whole store on one SQLite connection."""

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
        with self.tx():
            inst = self.get_instance(instance)
            if inst is None or inst.schedule_rev != schedule_rev:
                raise StaleSchedule(f"{instance} was rescheduled past revision {schedule_rev}")
            written = None
            if release is not None:
                written = self.create_release(release.app, release.build_digest,
                                              release.config, release.description)
                app = self.get_app(release.app)
                if app is not None and app.config != release.config:
                    self.set_app_config(app, release.config)
            for service, gen in candidates.items():
                self.set_active(instance, service, gen.id,
                                expected=self.get_active(instance, service))
            for gen_id in retiring:
                self.add_inhibition(gen_id, retire_reason, op_id)
            web = candidates.get("web")
            if web is not None:
                self.set_route(instance, instance, RouteState.SERVING, web.port, web.id,
                               expected=self.get_route(instance))
            if inst.state is not InstanceState.RUNNING:
                self.set_instance_state(inst, InstanceState.RUNNING)
            if inst.pending_release is not None:
                # What is installed now supersedes a release deferred to a wake.
                self.clear_pending(instance, inst.pending_release)
        return written

    def defer_release(self, instance: str, *, schedule_rev: int, number: int, cause: Cause,
                      release: ReleaseDraft | None) -> Release | None:
        """Release `number` pending on a parked `instance`, the release row written when
        `release` is given, in one write; compare-and-swap on the schedule revision, as
        `install` does, so a superseded rollout defers nothing. The instance's route and
        processes are untouched: it stays parked until a request wakes it."""
        with self.tx() as c:
            inst = self.get_instance(instance)
            if inst is None or inst.schedule_rev != schedule_rev:
                raise StaleSchedule(f"{instance} was rescheduled past revision {schedule_rev}")
            written = None
            if release is not None:
                written = self.create_release(release.app, release.build_digest,
                                              release.config, release.description)
                number = written.number
                app = self.get_app(release.app)
                if app is not None and app.config != release.config:
                    self.set_app_config(app, release.config)
            # A release still pending keeps its cause: a config change on top of a
            # deferred release runs a new build all the same, and must fall back as one.
            c.execute("UPDATE instances SET pending_release=?, pending_cause=CASE WHEN"
                      " pending_release IS NOT NULL AND pending_cause=? THEN pending_cause"
                      " ELSE ? END, version=version+1 WHERE host=?",
                      (number, Cause.RELEASE.value, cause.value, instance))
        return written

    def clear_pending(self, instance: str, number: int) -> None:
        with self.tx() as c:
            c.execute("UPDATE instances SET pending_release=NULL, pending_cause=NULL,"
                      " version=version+1 WHERE host=? AND pending_release=?",
                      (instance, number))

    def activate_and_route(self, instance: str, generations: Mapping[str, int]) -> None:
        """Name `generations` ACTIVE (service -> generation id) and, in the same write,
        route the instance to its ACTIVE web if that one is not gone: the route never
        names a web generation that ACTIVE does not."""
        with self.tx():
            for service, gen_id in generations.items():
                self.set_active(instance, service, gen_id,
                                expected=self.get_active(instance, service))
            web_active = self.get_active(instance, "web")
            web = self.get_generation(web_active.generation_id) if web_active else None
            if web is not None and web.state is not GenState.GONE:
                self.set_route(instance, instance, RouteState.SERVING, web.port, web.id,
                               expected=self.get_route(instance))

    def fall_back(
        self, instance: str, *, active: Mapping[str, int], unmark: Iterable[int],
        unmark_reason: Inhibition, web: Generation | None,
    ) -> bool:
        """Put back what a failed attempt replaced, in one write: `active` (service ->
        generation id) ACTIVE again, the `unmark_reason` mark off each of `unmark`, and
        the route to `web` (gated when None). True if the route changed.

        A route already right is left untouched (the journal shows the failure, nothing
        else); an instance that never had a route and has no web gets none."""
        with self.tx():
            for service, gen_id in active.items():
                self.set_active(instance, service, gen_id,
                                expected=self.get_active(instance, service))
            for gen_id in unmark:
                self.remove_inhibition(gen_id, unmark_reason)
            route = self.get_route(instance)
            want: tuple[RouteState, int | None, int | None] = (
                (RouteState.SERVING, web.port, web.id) if web is not None
                else (RouteState.GATED, None, None))
            have = (route.state, route.port, route.generation_id) if route else None
            changed = have != want and (route is not None or web is not None)
            if changed:
                self.set_route(instance, instance, *want, expected=route)
        return changed

    def take_out_of_service(self, instance: str, state: InstanceState,
                            reason: str | None = None) -> bool:
        """Put the instance in `state` (why: `reason`) and gate its route, in one write.
        True if the route changed, so the caller publishes.

        One write, because the two halves mean one thing: an instance not RUNNING whose
        route still served would take traffic that nothing restarts (invariant 2), and
        a gated route on a RUNNING instance would look like a fault to the reconciler.
        `NotFound` if there is no such instance."""
        with self.tx():
            inst = self.get_instance(instance)
            if inst is None:
                raise NotFound(f"no instance {instance}")
            if inst.state is not state or inst.down_reason != reason:
                self.set_instance_state(inst, state, reason)
            route = self.get_route(instance)
            if route is None or route.state is RouteState.GATED:
                return False
            self.set_route(instance, instance, RouteState.GATED, None, None, expected=route)
            return True

    def instance_views(self) -> list[InstanceView]:
        """Every instance as convergence reads it, in a fixed handful of queries: boot
        and the periodic pass plan 10,000 instances without 60,000 round trips. Read
        without an await between its queries, so it is one consistent picture for the
        control plane that holds the only writer."""
        latest = self.latest_operations()
        marks = self.all_inhibitions()
        active: dict[str, dict[str, int]] = {}
        for a in self.list_active():
            active.setdefault(a.instance, {})[a.service] = a.generation_id
        live: dict[str, list[Generation]] = {}
        for g in self.live_generations():
            live.setdefault(g.instance, []).append(g)
        routes = {r.host: r for r in self.list_routes()}
        fenced = self.fenced_instances()
        return [InstanceView(
            instance=inst, latest=latest.get(inst.host), active=active.get(inst.host, {}),
            live=live.get(inst.host, []),
            inhibitions={g.id: marks.get(g.id, frozenset()) for g in live.get(inst.host, [])},
            route=routes.get(inst.host), fenced=inst.host in fenced,
        ) for inst in self.list_instances()]
    def park(self, inst: Instance) -> Instance:
        """The instance PARKED and its route (if it has one) `parked`, with no upstream,
        in one write; compare-and-swap on `inst.version`. So the router is never told to
        hold a host whose instance is recorded running, nor to serve one recorded parked."""
        with self.tx():
            parked = self.set_instance_state(inst, InstanceState.PARKED)
            route = self.get_route(inst.host)
            if route is not None and route.state is not RouteState.PARKED:
                self.set_route(inst.host, inst.host, RouteState.PARKED, None, None,
                               expected=route)
        return parked
