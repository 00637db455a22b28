"""Publishing routes: the store's route rows, pushed whole to the router.

The route row is written to the store first (the journal), then the whole table is
pushed with a fresh version. Crash between the two: the row names the new generation,
the router still the old one; boot republishes the whole table, so the router converges
to the store. The router refuses a table older than the one it has, so a slow push can
never undo a newer one.

One bad route never stops another's: each row is checked on its own (here, then again
by the router), a refused one is left out of the table (its host gets no route) and the
rest are pushed. The refusal is reported to the one instance it belongs to: a publish
made for that instance raises `RouteRefused`, so its operation fails saying why, and
every other instance's publishes go on.

The router says what is true of each host (`page_state`, from records alone): a route
the store gates is published `stopped` when its instance is stopped or being removed,
`crashed` while its web waits out a crash backoff (Retry-After: when the retry is due,
rounded up to a whole second), `no-release` when nothing was ever made ACTIVE in it, and
`gated` otherwise (an import, a fence, a release that left it down). An instance with no
route row (nothing deployed yet, or stopped before it ever ran) and its aliases are
published `no-release` or `stopped`, never left to a 404 that says no site is there.
Every entry of an alias names its instance (`instance`), so the router wakes, holds and
counts it as that instance.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from keelway import failpoints, names
from keelway.builds.errors import ManifestError
from keelway.builds.manifest import WEB, load_manifest
from keelway.deploy.errors import RouteRefused, RouterUnavailable
from keelway.deploy.targets import build_path
from keelway.router import route_table as rt
from keelway.router.client import (
    RouterControlError,
    RouterRefused,
    get_table,
    inflight,
    push_routes,
)
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.store.records import Generation, Instance, Route

log = logging.getLogger("keelway.publisher")

failpoints.declare("publish.before", "publish.after")

RETRY_AFTER_S = 5

def router_state(state: RouteState) -> rt.Handling:
    """The router table's state for a store route state: the same word (`parked`: the
    router holds the request and asks the control plane for a wake), but `frozen`,
    which the router treats as `parked`: a request to a frozen instance waits for the
    wake that thaws it, and never reaches a process that cannot answer."""
    if state is RouteState.FROZEN:
        return rt.Handling.PARKED
    return rt.Handling(state.value)


@dataclass(frozen=True)
class Standing:
    """What the router's page for an instance depends on beyond its route rows."""

    state: InstanceState
    removing: bool = False
    # Something was ever made ACTIVE in it (a release ran, or runs, or waits in a park).
    deployed: bool = True
    aliases: tuple[str, ...] = ()

    @classmethod
    def of(cls, inst: Instance, deployed: bool, aliases: tuple[str, ...]) -> Standing:
        return cls(inst.state, inst.removing is not None, deployed, aliases)


def page_state(state: rt.Handling, standing: Standing | None,
               retry_in_s: float | None) -> rt.Handling:
    """What a route the store gates says (any other state is published as it is).
    `retry_in_s`: the instance's web waits out a crash backoff, due in that long."""
    if state is not rt.Handling.GATED or standing is None:
        return state
    if standing.removing or standing.state is InstanceState.STOPPED:
        return rt.Handling.STOPPED
    if retry_in_s is not None:
        return rt.Handling.CRASHED
    if not standing.deployed:
        return rt.Handling.NO_RELEASE
    return state


@dataclass(frozen=True)
class HttpPolicy:
    """An app's `[http]` as its instances' routes carry it (keelway/builds/manifest.py)."""

    max_concurrency: int | None = None
    force_https: bool = False
    hsts_s: int | None = None


NO_POLICY = HttpPolicy()


def table_of(routes: list[Route], version: int,
             retry_in_s: Mapping[str, float] | None = None,
             standings: Mapping[str, Standing] | None = None,
             policies: Mapping[str, HttpPolicy] | None = None,
             ) -> tuple[rt.RouteTable, dict[str, str]]:
    """The router's table for the store's route rows, and each row refused (by host,
    with the reason), which the table leaves out. `retry_in_s` maps an instance whose
    web waits out a crash backoff to the seconds until its retry; `standings` says what
    each instance is (without it, every row is published by its state alone, and
    instances without rows get none); `policies` an instance's `[http]` (of the release it
    serves: its bound on requests in flight, HTTPS), on each of its hosts."""
    retry_in_s = retry_in_s or {}
    policies = policies or {}
    standings = standings or {}
    entries: dict[str, rt.RouteEntry] = {}
    refused: dict[str, str] = {}

    def put(host: str, instance: str, state: rt.Handling, upstream: str | None,
            generation: int | None = None) -> None:
        retry = retry_in_s.get(instance)
        retry_after_s = RETRY_AFTER_S
        if retry is not None and state in (rt.Handling.GATED, rt.Handling.CRASHED):
            retry_after_s = max(1, math.ceil(retry))
        policy = policies.get(instance, NO_POLICY)
        try:
            names.HOST.check(host)
            entries[host] = rt.RouteEntry(state=state, upstream=upstream,
                                          retry_after_s=retry_after_s,
                                          instance=instance if instance != host else None,
                                          max_concurrency=policy.max_concurrency,
                                          force_https=policy.force_https,
                                          hsts_s=policy.hsts_s,
                                          generation=generation)
        except ValueError as exc:  # InvalidName, or a route that fails its own checks
            refused[host] = str(exc)

    routed: set[str] = set()
    for route in routes:
        routed.add(route.instance)
        state = router_state(route.state)
        upstream = (f"127.0.0.1:{route.port}" if route.port is not None
                    and route.state is not RouteState.FROZEN else None)
        if state is rt.Handling.SERVING and upstream is None:
            state = rt.Handling.GATED  # nothing to serve with: answer 503, never guess
        state = page_state(state, standings.get(route.instance),
                           retry_in_s.get(route.instance))
        # The generation behind the upstream, which only the access log reads.
        put(route.host, route.instance, state, upstream,
            route.generation_id if upstream is not None else None)
    for instance, standing in standings.items():
        if instance in routed:
            continue
        state = page_state(rt.Handling.GATED, standing, None)
        if state is rt.Handling.GATED:
            continue  # deployed, and still no route (no web): no page to give
        for host in (instance, *standing.aliases):
            put(host, instance, state, None)
    return rt.RouteTable(version=version, routes=entries), refused


@dataclass(eq=False)
class Publisher:
    store: Store
    control_socket: Path

    def __post_init__(self) -> None:
        # What the last publish refused, so a lasting refusal is logged once, not per push.
        self._refused: dict[str, str] = {}
        # Pushes are one at a time and shared (`publish`): how many began, and what the
        # last one to end well applied (its version, its refusals, each host's instance)
        # with its number.
        self._pushing = asyncio.Lock()
        self._policy_of_build: dict[tuple[str, str], HttpPolicy] = {}
        self._began = 0
        self._last: tuple[int, dict[str, str], dict[str, str]] = (0, {}, {})
        self._last_number = 0

    def _table(self, routes: list[Route], version: int,
               ) -> tuple[rt.RouteTable, dict[str, str]]:
        store = self.store
        now = store.clock.now()
        retry_in_s = {r.instance: r.retry_at - now for r in store.generations.pending_retries()
                      if r.service == "web"}
        # What ACTIVE names, read once: whether each instance was ever deployed, and the
        # build its web runs (its `[http] max_concurrency`).
        active = store.generations.active_generations()
        deployed = {gen.instance for gen in active}
        aliases: dict[str, list[str]] = {}
        for alias in store.instances.list_aliases():
            aliases.setdefault(alias.instance, []).append(alias.host)
        standings = {
            inst.host: Standing.of(inst, inst.host in deployed
                                   or inst.pending_release is not None,
                                   tuple(aliases.get(inst.host, ())))
            for inst in store.instances.list_instances()}
        return table_of(routes, version, retry_in_s, standings, self._policies(active))

    def _policies(self, active: list[Generation]) -> dict[str, HttpPolicy]:
        """Each instance's `[http]`, from the build its web runs (`active`: what ACTIVE
        names), each build's manifest read once (a build never changes)."""
        policies: dict[str, HttpPolicy] = {}
        for gen in active:
            if gen.service != WEB:
                continue
            key = (gen.app, gen.build_digest)
            if key not in self._policy_of_build:
                path = build_path(self.store, gen.app, gen.build_digest)
                try:
                    manifest = load_manifest(path) if path else None
                except (ManifestError, OSError):
                    manifest = None  # a build gone or unreadable: the router's defaults
                self._policy_of_build[key] = NO_POLICY if manifest is None else HttpPolicy(
                    manifest.http_max_concurrency, manifest.http_force_https,
                    manifest.http_hsts_s)
            policies[gen.instance] = self._policy_of_build[key]
        return policies

    async def publish(self, instance: str | None = None) -> int:
        """Push the store's whole route table; returns the version the router applied.

        Callers share pushes: one that began after this call read every route written
        before it, so when one such push has ended this call returns with it, and
        otherwise it makes one. A cohort of a rollout publishing its instances at once
        is a few pushes of the whole table, not one per instance, and no caller returns
        before a push that holds what it wrote.

        With `instance`, a route of that instance that was refused (here or by the
        router) raises RouteRefused after the push: the rest of the table is applied
        all the same. Refusals of other instances' routes are only logged.
        """
        ticket = self._began
        async with self._pushing:
            if self._last_number <= ticket:  # no push begun since this call ended well
                self._began += 1
                number = self._began
                self._last, self._last_number = await self._push(), number
        version, refused, owner = self._last
        if instance is not None:
            mine = sorted(h for h in refused if owner.get(h, h) == instance)
            if mine:
                raise RouteRefused(
                    "; ".join(f"publish route for {h!r}: {refused[h]}" for h in mine),
                    hint="every other route was published; this one stays unrouted "
                         "until its record is valid (see the router log)")
        return version

    async def _push(self) -> tuple[int, dict[str, str], dict[str, str]]:
        """One push of the store's whole table: the version applied, what was refused,
        and each routed host's instance."""
        routes = self.store.routes.list_routes()
        version = self.store.routes.next_route_table_version()
        failpoints.hit("publish.before")
        table, refused = self._table(routes, version)
        try:
            try:
                applied = await push_routes(self.control_socket, table)
            except RouterRefused:
                # The router kept a table from a store we no longer have (a new home
                # database, a restored backup): jump past its version and push again.
                served = await get_table(self.control_socket)
                version = self.store.routes.next_route_table_version(at_least=served.version)
                table, refused = self._table(routes, version)
                applied = await push_routes(self.control_socket, table)
        except RouterControlError as exc:
            raise RouterUnavailable(
                f"could not push routes to the router: {exc}",
                hint="check `keelway status`; the router restarts with `keelway up`",
            ) from exc
        failpoints.hit("publish.after")
        refused.update(applied.refused)
        self._note(refused)
        return applied.version, refused, {route.host: route.instance for route in routes}

    def _note(self, refused: dict[str, str]) -> None:
        for host, why in refused.items():
            if self._refused.get(host) != why:
                log.warning("the route for %r is refused, left out of the table: %s",
                            host, why)
        self._refused = refused

    async def in_sync(self) -> bool:
        """Whether the router serves exactly the store's routes (any version)."""
        try:
            served = await get_table(self.control_socket)
        except RouterControlError:
            return False
        return served.routes == self._table(self.store.routes.list_routes(),
                                            served.version)[0].routes

    async def drained(self, port: int, bound_s: float, poll_s: float = 0.02) -> bool:
        """Wait until the router carries no request to 127.0.0.1:`port`, up to `bound_s`.

        The route already sends new requests elsewhere; this is the bounded drain of the
        ones in flight. True when drained, False at the bound (or with no router to ask,
        after waiting the bound out, the conservative answer).
        """
        key = f"127.0.0.1:{port}"
        clock = self.store.clock  # the injected one: a test's drain bound passes at once
        deadline = clock.monotonic() + bound_s
        while clock.monotonic() < deadline:
            try:
                counts = await inflight(self.control_socket, timeout_s=1.0)
            except RouterControlError:
                await clock.sleep(poll_s)
                continue
            if counts.get(key, 0) <= 0:
                return True
            await clock.sleep(poll_s)
        return False
