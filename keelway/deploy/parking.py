"""Scale to zero: park, wake, and the fences that keep an instance down.

Park and wake are specs (keelway/deploy/operation.py) the one runner carries out:
journaled operations under the instance lock, after convergence, each step run through
keelway/deploy/steps.py:

- park: one store intent puts the instance PARKED and its route `parked` (the router
  holds requests and asks for a wake) → publish → stop every generation and prove it
  gone. ACTIVE stays, so a wake respawns exactly what ran. Crash after the intent: the
  reconciler stops any ACTIVE generation still alive of a parked instance
  (keelway/reconcile/plan.py) and boot republishes; before it: nothing changed.
- wake: the instance RUNNING (a step of its own, before anything spawns) → respawn the
  ACTIVE services through the verified start path (`CrashRestarts.respawn_active`: spawn and
  ready steps, readiness by NOTIFY_SOCKET or tight probing) → ACTIVE and the route
  serving in one write → publish. Crash after the RUNNING step: the instance is running
  with its ACTIVE dead, which boot restarts (RECOVER), removing an unpublished candidate
  first, so a hold-mode worker is proven gone before its successor spawns.
  One wake per instance at a time: a second call joins the one in flight (`wake_soon`).
  A wake that fails to start what ACTIVE names is a crash (`CrashRestarts.respawn_active`
  counts it with the one backoff and gates the parked route, so requests get 503 +
  Retry-After at once): the instance stays running, waiting out its backoff, and the
  crash restart retries it, not the next request. An operator's `keelway wake` of an
  instance waiting out its backoff tries now (a failure counts again); the router's
  wake, asked by a request, never does: a parked instance whose web still waits out its
  backoff (parked while it did) refuses it (`CrashBackoff`, 503), so its requests get
  503 at once until the retry is due, and the first request after that wakes it.

Fences live in keelway/deploy/fences.py; a held one refuses a wake (`fence_verb`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import assert_never

from keelway import failpoints, names
from keelway.builds.manifest import WEB
from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.attempt import Attempt
from keelway.deploy.crash_restarts import CrashRestarts
from keelway.deploy.errors import AppFailed, OperationError, UserError
from keelway.deploy.fences import refuse_if_fenced
from keelway.deploy.freezing import is_frozen, publish_effect, set_route, thaw_steps, thaw_trees
from keelway.deploy.instances import lay_down_step
from keelway.deploy.operation import (
    Bound,
    Ended,
    Plan,
    PlannedStep,
    Ran,
    Runner,
    Spec,
    stop_generation,
    stop_steps,
)
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.publisher import Publisher
from keelway.deploy.steps import Done, Effect, Failed
from keelway.deploy.wake_gate import WakeGate
from keelway.home import Home
from keelway.journal import Cause, OpKind, StepKind
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.store.records import Instance, Operation

log = logging.getLogger("keelway.parking")


def _quiet(_message: str) -> None:
    pass

failpoints.declare("park.before", "park.after", "wake.before", "wake.after")


class CrashBackoff(OperationError):
    """A request asked to wake an instance whose web waits out its crash backoff: not
    before the retry is due. Nothing was changed."""

    code = "crash-backoff"

    def __init__(self, message: str, hint: str | None, retry_at: float) -> None:
        super().__init__(message, hint)
        self.retry_at = retry_at


@dataclass(frozen=True)
class Parked:
    host: str
    parked: bool  # False: it was parked already
    stopped: tuple[int, ...] = ()


@dataclass(frozen=True)
class Woken:
    host: str
    woke: bool  # False: it was running already
    generations: dict[str, int]


@dataclass(eq=False)
class Parking:
    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    clock: Clock
    runner: Runner
    # A wake respawns what ACTIVE names, and a failed one counts as a crash.
    restarts: CrashRestarts

    def __post_init__(self) -> None:
        # The wake in flight per instance; an entry lives exactly as long as its task.
        self._wakes: dict[str, asyncio.Task[Woken]] = {}
        # When each instance last woke (the clock's monotonic time), so the idle sweep
        # counts idleness from then, not from a request the router saw before the park.
        self.woken_at: dict[str, float] = {}
        # How many cold wakes boot at once, fairly across apps (a wake storm).
        self.gate = WakeGate()

    # -- park ------------------------------------------------------------------------

    async def park(self, host: str, why: str = "by hand") -> Parked:
        """Park `host`: after return it is PARKED, its route parked and published, and
        every generation of it proven gone. A stopped or down instance is refused
        (nothing runs to scale to zero, and a request must not wake what its user
        stopped); a parked one is left as it is."""
        ran = await self.runner.run(PARK, self, ParkRequest(host, why))
        if ran.result is None:
            return Parked(host, parked=False)
        if not ran.done:
            raise OperationError(f"{host}: park failed: {ran.result.reason}",
                                 hint=f"see `keelway ops {ran.plan.app} --instance {host}`")
        self.woken_at.pop(host, None)
        return Parked(host, parked=True, stopped=tuple(
            s.before_gen for s in ran.plan.steps
            if s.kind is StepKind.STOP and s.before_gen is not None))

    def dry_park(self, host: str) -> Plan:
        """The plan `park` would run now; nothing is written."""
        return self.runner.dry_run(PARK, ParkRequest(host))

    def publish_effect(self, host: str) -> Effect:
        async def publish() -> Done | Failed:
            try:
                await self.publisher.publish(host)
            except OperationError as exc:
                return Failed(exc.message)
            return Done()

        return publish

    # -- wake ------------------------------------------------------------------------

    def wake_soon(self, host: str, retry_now: bool = False) -> asyncio.Task[Woken]:
        """The wake of `host`, started now or joined if one is in flight. Checks that
        can refuse at once (a bad name, no such instance, a fence) raise here, before
        any task exists. `host` may be an alias: its instance is woken, and a wake by
        either name joins the one in flight (SPEC: an alias wakes as its primary host).
        `retry_now` (an operator's wake): a running instance whose services wait out a
        crash backoff is started now instead of left to it."""
        claim = self.store.instances.claim(host) if names.HOST.accepts(host) else None
        if claim is not None and claim.alias:
            host = claim.instance
        inst = targets.instance_named(self.store, host)
        refuse_if_fenced(self.store, host, "wake")
        task = self._wakes.get(host)
        if task is not None and not task.done():
            return task
        if not retry_now and inst.state is InstanceState.PARKED:
            self._refuse_inside_backoff(inst)
        task = asyncio.get_running_loop().create_task(self._wake(host, retry_now))
        self._wakes[host] = task
        task.add_done_callback(lambda done: self._forget_wake(host, done))
        return task

    def _refuse_inside_backoff(self, inst: Instance) -> None:
        """Raise CrashBackoff if `inst`'s web waits out a crash backoff not yet due."""
        now = self.clock.now()
        due = [r.retry_at for r in self.store.generations.pending_retries(inst.host)
               if r.service == WEB and r.retry_at > now]
        if due:
            at = time.strftime("%H:%M:%S", time.localtime(due[0]))
            raise CrashBackoff(f"{inst.host} crashed at its last start; next retry at {at}",
                               hint=f"`keelway wake {inst.host}` tries now", retry_at=due[0])

    def _forget_wake(self, host: str, task: asyncio.Task[Woken]) -> None:
        if self._wakes.get(host) is task:
            del self._wakes[host]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # A caller that did not wait (the router's 202) hears it by the route table;
            # the journal and this line say why.
            log.warning("wake of %s: %s", host,
                        exc.message if isinstance(exc, OperationError) else exc)

    async def wake(self, host: str) -> Woken:
        """An operator's wake, waited for: it also retries now what waits out a crash
        backoff."""
        return await asyncio.shield(self.wake_soon(host, retry_now=True))

    async def _wake(self, host: str, retry_now: bool) -> Woken:
        inst = targets.instance_named(self.store, host)
        if inst.state is InstanceState.PARKED:
            # A cold wake boots the app: one of the gate's turns (a thaw needs none).
            async with self.gate.turn(inst.app):
                ran = await self.runner.run(WAKE, self, WakeRequest(host, retry_now))
        else:
            ran = await self.runner.run(WAKE, self, WakeRequest(host, retry_now))
        if ran.result is None:
            return Woken(host, woke=False, generations=self._active(host))
        return self._woken(ran.plan.app, host, ran.result)

    def dry_wake(self, host: str) -> Plan:
        """The plan an operator's `wake` would run now; nothing is written."""
        return self.runner.dry_run(WAKE, WakeRequest(host, retry_now=True))

    def _woken(self, app: str, host: str, result: Result) -> Woken:
        if result.outcome is not Outcome.DONE:
            retry_at = self.restarts.retry_due(host)
            retry = ("" if retry_at is None else
                     f"; it is retried with the crash backoff, next at "
                     f"{time.strftime('%H:%M:%S', time.localtime(retry_at))} "
                     f"(`keelway status {app}`), or now by `keelway wake {host}`")
            raise AppFailed(f"{host}: wake failed: {result.reason}{retry}",
                            hint=f"see `keelway logs {app} --instance {host}`")
        self.woken_at[host] = self.clock.monotonic()
        return Woken(host, woke=True, generations=self._active(host))

    async def wake_onto_pending(self, op: Operation, inst: Instance) -> Result | None:
        """Run the release a rollout deferred to this wake, as the attempt the rollout
        would have run had the instance been awake: candidates, the settle window,
        ACTIVE and the route in one install, and on failure the fallback of its cause
        and mode (overlap: back to the good build; hold that executed: down). None when
        the release can no longer run (its build is gone): the wake brings back what
        ACTIVE names instead, and the log says why."""
        number = inst.pending_release
        assert number is not None
        target = targets.release_target(self.store, inst.app, number)
        if target is None:
            log.warning("wake of %s: v%d, deferred to it, has no staged build; it wakes "
                        "on what ran before", inst.host, number)
            self.store.clear_pending(inst.host, number)
            return None
        await lay_down_step(self.store, self.home, op.id, inst.host)
        result = await Attempt(
            store=self.store, home=self.home, supervisor=self.supervisor,
            publisher=self.publisher, op=op, host=inst.host,
            cause=inst.pending_cause or Cause.RELEASE, target=target,
            rev=inst.schedule_rev, release=None, progress=_quiet).run()
        if result.outcome is not Outcome.SUPERSEDED:
            # Tried once, whatever came of it: a failed release is not tried again by
            # every later wake (the journal and `keelway ops` say how it failed).
            self.store.clear_pending(inst.host, number)
        if result.outcome is Outcome.FAILED:
            # A fallback that could not start either is a failed wake like any other.
            await self.restarts.count_dead_active(inst.host)
        return result

    def _active(self, host: str) -> dict[str, int]:
        return {a.service: a.generation_id for a in self.store.generations.list_active(host)}


# -- the park operation -------------------------------------------------------------


@dataclass(frozen=True)
class ParkRequest:
    host: str
    why: str = "by hand"


def plan_park(store: Store, request: ParkRequest) -> Plan:
    """Park's plan: the intent (instance PARKED and route parked, one write), the
    publish, then a stop of every live generation but the replicator (stopped after the
    app with a last sync, by the replication hook). A parked instance has nothing to do;
    a stopped or down one is refused (UserError)."""
    host = request.host
    inst = targets.instance_named(store, host)
    match inst.state:
        case InstanceState.PARKED:
            return Plan(OpKind.PARK, inst.app, host, nothing="parked already")
        case InstanceState.STOPPED | InstanceState.DOWN:
            raise UserError(f"{host} is {inst.state.value}; only a running instance "
                            "parks", hint=f"`keelway start {inst.app} --instance "
                                          f"{host}` first")
        case InstanceState.RUNNING:
            pass
        case _:
            assert_never(inst.state)
    return Plan(OpKind.PARK, inst.app, host, (
        PlannedStep(StepKind.PARK, f"{host} PARKED and its route parked, in one write "
                    f"({request.why})", "intent", before=("park.before",),
                    after=("park.after",)),
        # A failed publish ends the plan: the router may still send requests to what
        # would be stopped, and the reconciler's rule for a parked instance (plan.py)
        # stops them at its next pass, after which boot and the periodic pass
        # republish. A router that cannot be reached serves nothing better meanwhile.
        PlannedStep(StepKind.PUBLISH, "publish the route table", "publish"),
        *stop_steps(store, host)))


def _park_intent(parking: Parking, request: ParkRequest, _step: PlannedStep) -> Bound:
    async def intent(_op: Operation) -> Done:
        inst = targets.instance_named(parking.store, request.host)
        parking.store.park(inst)
        return Done(f"parked ({request.why})")

    return intent


def _publish(parking: Parking, request: ParkRequest, _step: PlannedStep) -> Bound:
    effect = parking.publish_effect(request.host)

    async def publish(_op: Operation) -> Done | Failed:
        return await effect()

    return publish


def _stop(parking: Parking, _request: ParkRequest, step: PlannedStep) -> Bound:
    return stop_generation(parking.store, parking.supervisor, step)


PARK: Spec[ParkRequest, Parking] = Spec(
    OpKind.PARK, plan_park, {"intent": _park_intent, "publish": _publish, "stop": _stop})


# -- the wake operation -------------------------------------------------------------


@dataclass(frozen=True)
class WakeRequest:
    host: str
    # An operator's wake: a running instance whose services wait out a crash backoff is
    # started now (a failure counts again) instead of left to its retry.
    retry_now: bool = False


def plan_wake(store: Store, request: WakeRequest) -> Plan:
    """Wake's plan. A parked instance: RUNNING first (before anything spawns), then the
    release a rollout deferred to this wake if there is one (an attempt, which journals
    its own steps), then the web (published alone, so held requests go as soon as it is
    ready) and the workers. A running one: nothing, or with `retry_now` and a crash
    retry pending, a start now of what waits out its backoff. A stopped or down one is
    refused: a wake does not start what its user stopped."""
    host = request.host
    inst = targets.instance_named(store, host)
    match inst.state:
        case InstanceState.RUNNING:
            if is_frozen(store, host):
                # Frozen (keelway/deploy/freezing.py): thawed, then served again.
                return Plan(OpKind.WAKE, inst.app, host, thaw_steps())
            if not (request.retry_now and store.generations.pending_retries(host)):
                return Plan(OpKind.WAKE, inst.app, host, nothing="running already")
            return Plan(OpKind.WAKE, inst.app, host, (
                PlannedStep(StepKind.SPAWN, "start now what ACTIVE names that waits out a "
                            "crash backoff, and publish its route", "respawn",
                            journals_own=True),))
        case InstanceState.STOPPED | InstanceState.DOWN:
            raise UserError(f"{host} is {inst.state.value}, not parked; a wake does "
                            "not start it", hint=f"`keelway start {inst.app} "
                                                 f"--instance {host}`")
        case InstanceState.PARKED:
            pass
        case _:
            assert_never(inst.state)
    steps = [PlannedStep(StepKind.WAKE, f"{host} RUNNING, before anything of it spawns",
                         "running", before=("wake.before",), after=("wake.after",))]
    if inst.pending_release is not None:
        steps.append(PlannedStep(
            StepKind.LAY_DOWN, f"run v{inst.pending_release}, deferred to this wake, as "
            "an attempt (candidates, the settle window, then ACTIVE and the route; on "
            "failure its fallback)", "deferred", arg=inst.pending_release,
            journals_own=True))
    active = store.generations.list_active(host)
    workers = frozenset(a.service for a in active if a.service != WEB)
    # Web first, published alone; then the workers. A crash between the two leaves a
    # running instance whose ACTIVE workers are dead, which boot restarts (RECOVER).
    if workers and len(workers) < len(active):
        steps += [PlannedStep(StepKind.SPAWN, "start the ACTIVE web and publish its route",
                              "respawn-web", journals_own=True),
                  PlannedStep(StepKind.SPAWN, "start the ACTIVE workers "
                              f"({', '.join(sorted(workers))})", "respawn",
                              journals_own=True)]
    else:
        steps.append(PlannedStep(StepKind.SPAWN, "start what ACTIVE names and publish its "
                                 "route", "respawn", journals_own=True))
    return Plan(OpKind.WAKE, inst.app, host, tuple(steps))


def _wake_running(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    async def running(_op: Operation) -> Done:
        inst = targets.instance_named(parking.store, request.host)
        parking.store.instances.set_instance_state(inst, InstanceState.RUNNING)
        return Done()

    return running


def _wake_deferred(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    async def deferred(op: Operation) -> Done | Ended:
        inst = targets.instance_named(parking.store, request.host)
        if inst.pending_release is None:
            return Done()
        result = await parking.wake_onto_pending(op, inst)
        return Done() if result is None else Ended(result)

    return deferred


def _respawn_web(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    """The web alone (the workers wait), published: held requests go once it is ready."""
    async def respawn(op: Operation) -> Done | Failed:
        store = parking.store
        inst = targets.instance_named(store, request.host)
        workers = frozenset(a.service for a in store.generations.list_active(inst.host)
                            if a.service != WEB)
        return _said(await parking.restarts.respawn_active(op, inst, waiting=workers))

    return respawn


def _respawn(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    """Whatever ACTIVE names that is not alive (after `_respawn_web`: the workers)."""
    async def respawn(op: Operation) -> Done | Failed:
        inst = targets.instance_named(parking.store, request.host)
        return _said(await parking.restarts.respawn_active(op, inst))

    return respawn


def _said(result: Result) -> Done | Failed:
    return Done() if result.outcome is Outcome.DONE else Failed(
        result.reason or "the start failed")


def _thaw(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    async def thaw(_op: Operation) -> Done:
        return thaw_trees(parking.store, parking.supervisor, request.host)
    return thaw


def _unfrozen(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    async def unfrozen(_op: Operation) -> Done:
        set_route(parking.store, request.host, RouteState.SERVING)
        return Done()
    return unfrozen


def _publish_thawed(parking: Parking, request: WakeRequest, _step: PlannedStep) -> Bound:
    return publish_effect(parking.publisher, request.host)


async def _link_current(parking: Parking, request: WakeRequest, ran: Ran) -> None:
    if ran.result is not None:
        targets.link_current(parking.store, parking.home, request.host)


WAKE: Spec[WakeRequest, Parking] = Spec(
    OpKind.WAKE, plan_wake,
    {"running": _wake_running, "deferred": _wake_deferred,
     "respawn-web": _respawn_web, "respawn": _respawn, "thaw": _thaw,
     "unfrozen": _unfrozen, "publish-thawed": _publish_thawed},
    fence_verb="wake", converge_after=True, after=_link_current)
