"""The idle sweep: one loop for the whole control plane (no task or timer per instance)
that freezes instances the router has seen idle for long enough, and parks them later.

The rules (SPEC §4 Activator), decided by `to_act` from values alone:
- only a running, unfenced instance whose services all declare `idle` and that has a
  web is a candidate (a worker-only instance has no request to wake it by); its bound
  is the smallest `idle` its services declare;
- it is frozen (keelway/deploy/freezing.py: its processes stopped in place, memory
  kept, its next request thawing it in milliseconds) once the router reports no open
  connection to it (`open == 0`: a WebSocket or an SSE stream counts as activity) and
  no request for at least that bound; parked at once instead where its services'
  smallest `park_after` is 0;
- a frozen instance is parked (its processes stopped, its memory given back) once it
  has been frozen for its `park_after` (default 15 min), or sooner when the frozen
  instances together use more memory than the box's frozen budget
  (`keelway up --frozen-budget`): the one frozen longest first, until they fit;
- "idle" is never longer than the instance has been awake as this control plane saw it
  (first seen running by the sweep, or woken): a wake without a request, or a
  control-plane restart, starts the count again instead of trusting an old idle time;
- a host the router does not report, or a router that cannot say (an older router, a
  timeout), parks nothing: without the router's counts nothing is known to be idle.

The sweep only parks an instance whose lock is free, never waiting behind an operation.
Time is the injected clock's (monotonic), so a test's 15-minute idle passes at once.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from keelway.activator.activity import Activity, ActivityUnknown, fetch_activity
from keelway.builds.errors import BuildError
from keelway.builds.manifest import WEB, Manifest, load_manifest
from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.errors import OperationError
from keelway.deploy.freezing import Freezing
from keelway.deploy.parking import Parking
from keelway.journal import REPLICA
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, RouteState

log = logging.getLogger("keelway.activator")

SWEEP_S = 2.0


class Verb(enum.Enum):
    FREEZE = "freeze"
    PARK = "park"


@dataclass(frozen=True)
class IdleBounds:
    """An instance's manifest's say: idle this long, then frozen; frozen this long
    (`park_after`), then parked."""

    idle_s: float
    park_after_s: float


@dataclass(frozen=True)
class Awake:
    """A running instance as the sweep sees it."""

    host: str
    idle_after_s: float | None  # the smallest `idle` of its services; None: never parks
    awake_for_s: float  # since this control plane saw it start running (or thawed)
    fenced: bool = False
    park_after_s: float = 0.0
    frozen: bool = False
    frozen_for_s: float = 0.0  # since this control plane saw it frozen
    memory_bytes: int = 0  # what its frozen processes keep (frozen ones only)


def bounds_of(manifest: Manifest) -> IdleBounds | None:
    """The instance's idle bounds, or None if it never goes idle (see `idle_after_s`)."""
    idle = idle_after_s(manifest)
    if idle is None:
        return None
    return IdleBounds(idle, min(spec.park_after_s for spec in manifest.services.values()))


def idle_after_s(manifest: Manifest) -> float | None:
    """The bound after which an instance of this manifest parks, or None if it never
    does: one service without `idle` keeps the whole instance awake."""
    if WEB not in manifest.services:
        return None
    bounds = [spec.idle_s for spec in manifest.services.values()]
    if any(bound is None for bound in bounds):
        return None
    return min(bound for bound in bounds if bound is not None)


def to_park(awake: Sequence[Awake], activity: Mapping[str, Activity]) -> list[str]:
    """The hosts idle enough to leave awake now (frozen or parked), in the order given."""
    return [host for host, _ in to_act(awake, activity)
            if not next(i for i in awake if i.host == host).frozen]


def to_act(awake: Sequence[Awake], activity: Mapping[str, Activity],
           frozen_budget: int | None = None) -> list[tuple[str, Verb]]:
    """What to do now with each instance, in the order given: freeze the idle ones
    (park them where `park_after` is 0), park the ones frozen long enough, then park
    the ones frozen longest until the frozen ones fit `frozen_budget` bytes."""
    chosen: list[tuple[str, Verb]] = []
    for inst in awake:
        if inst.fenced or inst.idle_after_s is None:
            continue
        if inst.frozen:
            if inst.frozen_for_s >= inst.park_after_s:
                chosen.append((inst.host, Verb.PARK))
            continue
        seen = activity.get(inst.host)
        if seen is None or seen.open > 0:
            continue
        if min(seen.idle_s, inst.awake_for_s) >= inst.idle_after_s:
            chosen.append((inst.host, Verb.FREEZE if inst.park_after_s > 0 else Verb.PARK))
    if frozen_budget is not None:
        parking = {host for host, verb in chosen if verb is Verb.PARK}
        kept = [i for i in awake if i.frozen and i.host not in parking and not i.fenced]
        total = sum(i.memory_bytes for i in kept)
        for inst in sorted(kept, key=lambda i: -i.frozen_for_s):
            if total <= frozen_budget:
                break
            chosen.append((inst.host, Verb.PARK))
            total -= inst.memory_bytes
    return chosen


@dataclass(eq=False)
class Sweep:
    store: Store
    parking: Parking
    control_socket: Path
    clock: Clock
    interval_s: float = SWEEP_S
    freezing: Freezing | None = None
    # What the frozen instances may keep together before the longest frozen park.
    frozen_budget: int | None = None

    def __post_init__(self) -> None:
        self._awake_since: dict[str, float] = {}  # running instances only
        self._frozen_since: dict[str, float] = {}  # frozen instances only
        self._bounds: dict[tuple[str, str], IdleBounds | None] = {}  # (app, build digest)
        self._unknown_said = False

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.interval_s)
            try:
                await self.once()
            except Exception:
                # Protects the loop: a sweep that fails (a full disk, say) is tried again
                # next time; parking is an optimisation, never a reason to stop.
                log.exception("idle sweep failed")

    def awake(self) -> list[Awake]:
        """Every running instance, with how long it has been awake (or frozen) and its
        bounds."""
        now = self.clock.monotonic()
        running = [
            i for i in self.store.instances.list_instances() if i.state is InstanceState.RUNNING]
        hosts = {i.host for i in running}
        frozen = {r.host for r in self.store.routes.list_routes()
                  if r.state is RouteState.FROZEN and r.host in hosts}
        for seen, keep in ((self._awake_since, hosts), (self._frozen_since, frozen)):
            for host in [h for h in seen if h not in keep]:
                del seen[host]
        found = []
        for inst in running:
            since = max(self._awake_since.setdefault(inst.host, now),
                        self.parking.woken_at.get(inst.host, now - 1e18))
            bounds = self._bound(inst.host)
            if bounds is None:
                continue
            is_frozen = inst.host in frozen
            frozen_for = now - self._frozen_since.setdefault(inst.host, now) if is_frozen \
                else 0.0
            found.append(Awake(inst.host, bounds.idle_s, now - since,
                               self.store.instances.fenced(inst.host),
                               bounds.park_after_s if self.freezing is not None else 0.0,
                               is_frozen, frozen_for,
                               self._memory(inst.host) if is_frozen and self.frozen_budget
                               is not None else 0))
        return found

    def _memory(self, host: str) -> int:
        """What `host`'s frozen processes keep (its replicator is never frozen)."""
        supervisor = self.parking.supervisor
        total = 0
        for gen in self.store.generations.live_generations(host):
            if gen.service == REPLICA:
                continue
            used = supervisor.trees.usage(gen.id, self.store.local.presence(gen.id).leader)
            total += used.memory_bytes or 0
        return total

    async def once(self) -> list[str]:
        """One sweep; returns the hosts it froze or parked."""
        awake = self.awake()
        if not awake:
            return []
        try:
            activity = await fetch_activity(self.control_socket)
        except ActivityUnknown as exc:
            if not self._unknown_said:  # said once, not every few seconds
                log.info("idle sweep: the router does not report activity (%s); nothing "
                         "is frozen or parked until it does", exc)
                self._unknown_said = True
            if not any(a.frozen for a in awake):
                return []
            activity = {}  # the frozen ones still park on their own clock
        else:
            self._unknown_said = False
        acted = []
        by_host = {a.host: a for a in awake}
        if self.frozen_budget is not None:
            keeping = sum(a.memory_bytes for a in awake if a.frozen)
            if keeping > self.frozen_budget:
                log.info("idle sweep: frozen instances keep %d bytes, over the frozen "
                         "budget of %d: the ones frozen longest are parked", keeping,
                         self.frozen_budget)
        for host, verb in to_act(awake, activity, self.frozen_budget):
            if self.parking.runner.busy(host):
                continue  # an operation runs: it is not idle in any sense that matters
            seen = activity.get(host)
            idle = f"idle for {seen.idle_s:.0f}s" if seen is not None else "idle"
            try:
                if verb is Verb.FREEZE and self.freezing is not None:
                    await self.freezing.freeze(host, why=idle)
                    self._frozen_since[host] = self.clock.monotonic()
                else:
                    why = (f"frozen for {by_host[host].frozen_for_s:.0f}s"
                           if by_host[host].frozen else idle)
                    await self.parking.park(host, why=why)
            except OperationError as exc:
                log.warning("idle sweep: %s", exc.message)
            else:
                acted.append(host)
        return acted

    def _bound(self, host: str) -> IdleBounds | None:
        target_gen = next((g for a in self.store.generations.list_active(host)
                           if (g := self.store.generations.get_generation(
                               a.generation_id)) is not None),
                          None)
        if target_gen is None:
            return None
        key = (target_gen.app, target_gen.build_digest)
        if key not in self._bounds:
            path = targets.build_path(self.store, *key)
            try:
                self._bounds[key] = bounds_of(load_manifest(path)) if path else None
            except BuildError:
                self._bounds[key] = None  # it was deployed, so this is a build gone bad
        return self._bounds[key]
