"""The idle sweep: one loop for the whole control plane (no task or timer per instance)
that parks instances the router has seen idle for long enough.

The rules (SPEC §4 Activator), decided by `to_park` from values alone:
- only a running, unfenced instance whose services all declare `idle` and that has a
  web is a candidate (a worker-only instance has no request to wake it by); its bound
  is the smallest `idle` its services declare;
- it parks once the router reports no open connection to it (`open == 0`: a WebSocket
  or an SSE stream counts as activity) and no request for at least that bound;
- "idle" is never longer than the instance has been awake as this control plane saw it
  (first seen running by the sweep, or woken): a wake without a request, or a
  control-plane restart, starts the count again instead of trusting an old idle time;
- a host the router does not report, or a router that cannot say (an older router, a
  timeout), parks nothing: without the router's counts nothing is known to be idle.

The sweep only parks an instance whose lock is free, never waiting behind an operation.
Time is the injected clock's (monotonic), so a test's 15-minute idle passes at once.
"""

from __future__ import annotations

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
from keelway.deploy.parking import Parking
from keelway.store import Store
from keelway.store.lifecycle import InstanceState

log = logging.getLogger("keelway.activator")

SWEEP_S = 2.0


@dataclass(frozen=True)
class Awake:
    """A running instance as the sweep sees it."""

    host: str
    idle_after_s: float | None  # the smallest `idle` of its services; None: never parks
    awake_for_s: float  # since this control plane saw it start running
    fenced: bool = False


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
    """The hosts to park now, in the order given."""
    chosen = []
    for inst in awake:
        seen = activity.get(inst.host)
        if inst.idle_after_s is None or inst.fenced or seen is None or seen.open > 0:
            continue
        if min(seen.idle_s, inst.awake_for_s) >= inst.idle_after_s:
            chosen.append(inst.host)
    return chosen


@dataclass(eq=False)
class Sweep:
    store: Store
    parking: Parking
    control_socket: Path
    clock: Clock
    interval_s: float = SWEEP_S

    def __post_init__(self) -> None:
        self._awake_since: dict[str, float] = {}  # running instances only
        self._bounds: dict[tuple[str, str], float | None] = {}  # (app, build digest)
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
        """Every running instance, with how long it has been awake and its bound."""
        now = self.clock.monotonic()
        running = [
            i for i in self.store.instances.list_instances() if i.state is InstanceState.RUNNING]
        hosts = {i.host for i in running}
        for host in [h for h in self._awake_since if h not in hosts]:
            del self._awake_since[host]
        found = []
        for inst in running:
            since = max(self._awake_since.setdefault(inst.host, now),
                        self.parking.woken_at.get(inst.host, now - 1e18))
            bound = self._bound(inst.host)
            if bound is None:
                continue
            found.append(Awake(inst.host, bound, now - since,
                               self.store.instances.fenced(inst.host)))
        return found

    async def once(self) -> list[str]:
        """One sweep; returns the hosts it parked."""
        awake = self.awake()
        if not awake:
            return []
        try:
            activity = await fetch_activity(self.control_socket)
        except ActivityUnknown as exc:
            if not self._unknown_said:  # said once, not every few seconds
                log.info("idle sweep: the router does not report activity (%s); nothing "
                         "is parked until it does", exc)
                self._unknown_said = True
            return []
        self._unknown_said = False
        parked = []
        for host in to_park(awake, activity):
            if self.parking.runner.busy(host):
                continue  # an operation runs: it is not idle in any sense that matters
            try:
                await self.parking.park(host, why=f"idle for {activity[host].idle_s:.0f}s")
            except OperationError as exc:
                log.warning("idle sweep: %s", exc.message)
            else:
                parked.append(host)
        return parked

    def _bound(self, host: str) -> float | None:
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
                self._bounds[key] = idle_after_s(load_manifest(path)) if path else None
            except BuildError:
                self._bounds[key] = None  # it was deployed, so this is a build gone bad
        return self._bounds[key]
