"""What one /metrics scrape reads: the store's figures and the router's, as a
`keelway.metrics.Scrape`.

Rules:
- Read when Prometheus asks, never counted on the way: the router's tallies through its
  control socket (`responses`, `activity`: keelway/router/client.py), the store in one
  consistent read away from the event loop (`Store.read_aside`), so a scrape of 10,000
  instances neither waits behind a rollout's journal writes nor holds them.
- States are the one status rule's (views.Fleet.status), as `keelway status` says them.
- A router's count outlives its instance's record (a removed instance's requests stay in
  the router's tallies until it restarts): its app is the one last seen for it, so an
  app's counter never drops when one of its instances goes. Only an instance this
  process never saw in the store has no app, and is left out.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from keelway import metrics
from keelway.api.views import DRILL_EVENTS, Fleet
from keelway.journal import OpKind
from keelway.router import client as router_client
from keelway.router.control_wire import HostActivity
from keelway.router.counts import ResponseCounts
from keelway.store import Store

log = logging.getLogger("keelway.admin")

# A scrape that waits longer than Prometheus's default timeout (10 s) is lost anyway.
ROUTER_TIMEOUT_S = 3.0
# Drills are events; an app's newest this many are read for its instances' last ones.
DRILL_EVENTS_READ = 500


@dataclass(frozen=True)
class StoreFigures:
    """The store's share of a scrape (crosses a process boundary: plain values)."""

    hosts: dict[str, str]  # instance host -> app
    states: list[tuple[str, str, str]]
    operations: list[tuple[str, str, str, int]]
    wakes: dict[str, metrics.Histogram]
    rollouts: list[tuple[str, str, int]]
    drills: list[metrics.LastDrill]


def store_figures(store: Store) -> StoreFigures:
    """Every figure /metrics takes from the store, in one read (Store.read_aside)."""
    fleet = Fleet.read(store)
    states: list[tuple[str, str, str]] = []
    hosts: dict[str, str] = {}
    for app, instances in fleet.by_app().items():
        for inst in instances:
            hosts[inst.host] = app
            states.append((app, inst.host, fleet.status(inst).state.value))
    operations = [(c.app, c.kind.value, c.state.value, c.count)
                  for c in store.ops.operation_counts()]
    bounds = metrics.WAKE_BUCKETS_S
    wakes = {app: metrics.Histogram(bounds, d.within, d.count, d.total_s)
             for app, d in store.ops.duration_counts(OpKind.WAKE, bounds).items()}
    rollouts = [(app, state.value, n) for app, state, n in store.rollouts.rollout_counts()]
    drills: list[metrics.LastDrill] = []
    for app in sorted(fleet.by_app()):
        # The newest drill event of each instance (as views.last_drills reads them).
        last: dict[str, metrics.LastDrill] = {}
        for event in store.ops.list_events(app, limit=DRILL_EVENTS_READ):
            if event.kind in DRILL_EVENTS and event.instance is not None:
                last[event.instance] = metrics.LastDrill(app, event.instance,
                                                     event.kind == "drill", event.at)
        drills += [d for host, d in sorted(last.items()) if host in hosts]
    return StoreFigures(hosts, states, operations, wakes, rollouts, drills)


class Scraper:
    """Reads one `Scrape` per call; remembers each instance's app (module header)."""

    def __init__(self, store: Store, router_socket: str, per_instance: bool) -> None:
        self.store = store
        self.router_socket = router_socket
        self.per_instance = per_instance
        self.apps_of: dict[str, str] = {}

    async def scrape(self) -> metrics.Scrape:
        figures, counted, open_now = await asyncio.gather(
            self.store.read_aside(store_figures), self._responses(), self._activity())
        self.apps_of.update(figures.hosts)
        return metrics.Scrape(
            per_instance=self.per_instance,
            traffic=self._traffic(counted, open_now) if counted is not None else None,
            router_started_at=counted.started_at if counted is not None else None,
            router_worker_restarts=counted.worker_restarts if counted is not None else 0,
            states=figures.states, operations=figures.operations, wakes=figures.wakes,
            rollouts=figures.rollouts, drills=figures.drills)

    def _traffic(self, counted: ResponseCounts,
                 open_now: dict[str, HostActivity] | None) -> list[metrics.InstanceTraffic]:
        found = []
        for instance in sorted(set(counted.instances) | set(open_now or {})):
            app = self.apps_of.get(instance)
            if app is None:
                continue
            counts = counted.of(instance)
            responses: dict[tuple[str, str], int] = {
                ("app", klass): n for klass, n in counts.app.items()}
            for status, n in counts.router.items():
                klass = f"{status[0]}xx" if len(status) == 3 and status.isdigit() else "other"
                responses[("router", klass)] = responses.get(("router", klass), 0) + n
            activity = (open_now or {}).get(instance)
            found.append(metrics.InstanceTraffic(
                app, instance, responses, activity.open if activity is not None else 0))
        return found

    async def _responses(self) -> ResponseCounts | None:
        try:
            return await router_client.responses(self.router_socket, ROUTER_TIMEOUT_S)
        except router_client.RouterControlError as exc:
            log.warning("metrics: the router's counts: %s", exc)
            return None

    async def _activity(self) -> dict[str, HostActivity] | None:
        try:
            return await router_client.activity(self.router_socket, ROUTER_TIMEOUT_S)
        except router_client.RouterControlError as exc:
            log.warning("metrics: the router's activity: %s", exc)
            return None
