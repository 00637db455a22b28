"""The frozen tier (issue #22): an idle instance's processes stopped in place, memory
kept, so its next request is answered in milliseconds rather than after a boot.

A freeze is a spec the one runner carries out, under the instance lock:
the route `frozen` in one write (the router then holds a request and asks for a wake,
as for a parked instance: keelway/deploy/publisher.py) → publish → every live
generation of the instance but its replicator frozen (the cgroup freezer, or SIGSTOP of
the whole tree where there is none: keelway/runtime/tree.py). The instance stays
RUNNING: what it runs, its crash restarts, its replicator (never frozen: its database
stays replicated) are a running instance's.

A thaw is the wake of a frozen instance (keelway/deploy/parking.py `plan_wake`): every
live generation thawed → the route serving again on the same port, in one write →
publish, which releases the held requests.

Crash windows: after the route write and before the trees are frozen, the instance is
"frozen" with its processes running, and its next request thaws nothing and serves; after
the thaw and before the route write, the same. The reconciler never moves a `frozen`
route back to serving by itself (keelway/reconcile/plan.py): a request, a `wake`, or an
operation that stops its processes (which thaws each tree before its SIGTERM:
Supervisor.stop) ends a freeze. A frozen instance stays frozen across a control-plane
restart, the cgroup's state being the kernel's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import assert_never

from keelway import failpoints
from keelway.deploy import targets
from keelway.deploy.errors import OperationError, UserError
from keelway.deploy.operation import Bound, Plan, PlannedStep, Runner, Spec
from keelway.deploy.publisher import Publisher
from keelway.deploy.steps import Done, Failed
from keelway.journal import REPLICA, OpKind, StepKind
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.store.records import Generation, Operation

log = logging.getLogger("keelway.freezing")

failpoints.declare("freeze.route.before", "freeze.route.after", "freeze.before",
                   "freeze.after", "thaw.before", "thaw.after", "thaw.route.before",
                   "thaw.route.after")


def is_frozen(store: Store, host: str) -> bool:
    """Whether `host` is frozen: running, its route `frozen`."""
    route = store.routes.get_route(host)
    return route is not None and route.state is RouteState.FROZEN


@dataclass(frozen=True)
class FreezeRequest:
    host: str
    why: str = "by hand"


@dataclass(eq=False)
class Freezing:
    store: Store
    supervisor: Supervisor
    publisher: Publisher
    runner: Runner

    async def freeze(self, host: str, why: str = "by hand") -> bool:
        """Freeze `host`; False if it was frozen already. A parked, stopped or down
        instance, or one with no web serving, is refused (UserError)."""
        ran = await self.runner.run(FREEZE, self, FreezeRequest(host, why))
        if ran.result is None:
            return False
        if not ran.done:
            raise UserError(f"{host}: freeze failed: {ran.result.reason}",
                            hint=f"see `keelway ops {ran.plan.app} --instance {host}`")
        return True

    def dry_freeze(self, host: str) -> Plan:
        return self.runner.dry_run(FREEZE, FreezeRequest(host))


def plan_freeze(store: Store, request: FreezeRequest) -> Plan:
    """Freeze's plan: the route frozen (one write), the publish, then every live
    generation but the replicator frozen. Nothing to do for a frozen one; refused for
    an instance that is not running and serving."""
    host = request.host
    inst = targets.instance_named(store, host)
    match inst.state:
        case InstanceState.RUNNING:
            pass
        case InstanceState.PARKED | InstanceState.STOPPED | InstanceState.DOWN:
            raise UserError(f"{host} is {inst.state.value}; only a running instance "
                            "freezes (a parked one is colder already)")
        case _:
            assert_never(inst.state)
    route = store.routes.get_route(host)
    if route is not None and route.state is RouteState.FROZEN:
        return Plan(OpKind.FREEZE, inst.app, host, nothing="frozen already")
    if route is None or route.state is not RouteState.SERVING:
        raise UserError(f"{host} is not serving (its route is "
                        f"{route.state.value if route else 'missing'}); only a serving "
                        "instance freezes")
    live = [g for g in store.generations.live_generations(host) if g.service != REPLICA]
    return Plan(OpKind.FREEZE, inst.app, host, (
        PlannedStep(StepKind.FREEZE_ROUTE, f"{host}'s route frozen, in one write "
                    f"({request.why}): the router holds its requests and asks for a wake",
                    "route", before=("freeze.route.before",), after=("freeze.route.after",)),
        PlannedStep(StepKind.PUBLISH, "publish the route table", "publish"),
        PlannedStep(StepKind.FREEZE, "freeze every process of "
                    + ", ".join(f"{g.service} generation {g.id}" for g in live)
                    + " in place, memory kept", "freeze",
                    before=("freeze.before",), after=("freeze.after",))))


def _route(part: Freezing, request: FreezeRequest, _step: PlannedStep) -> Bound:
    async def route(_op: Operation) -> Done:
        set_route(part.store, request.host, RouteState.FROZEN)
        return Done()
    return route


def set_route(store: Store, host: str, state: RouteState) -> None:
    """The instance's own route in `state`, its port and generation kept (aliases
    follow it: keelway/store/hosts.py)."""
    route = store.routes.get_route(host)
    if route is None or route.state is state:
        return
    store.routes.set_route(host, host, state, route.port, route.generation_id,
                           expected=route)


def publish_effect(publisher: Publisher, host: str) -> Bound:
    async def publish(_op: Operation) -> Done | Failed:
        try:
            await publisher.publish(host)
        except OperationError as exc:
            return Failed(exc.message)
        return Done()
    return publish


def _publish(part: Freezing, request: FreezeRequest, _step: PlannedStep) -> Bound:
    return publish_effect(part.publisher, request.host)


def _freeze(part: Freezing, request: FreezeRequest, _step: PlannedStep) -> Bound:
    async def freeze(_op: Operation) -> Done | Failed:
        return await freeze_trees(part.store, part.supervisor, request.host)
    return freeze


async def freeze_trees(store: Store, supervisor: Supervisor, host: str) -> Done | Failed:
    """Every live generation of `host` but its replicator frozen; a tree that would not
    freeze is thawed again and the step fails (a frozen route over running processes
    is harmless: its next request thaws nothing and serves)."""
    live = [g for g in store.generations.live_generations(host) if g.service != REPLICA]
    frozen: list[Generation] = []
    for gen in live:
        if not await supervisor.freeze(gen):
            for done in (*frozen, gen):
                supervisor.thaw(done)
            return Failed(f"{gen.service} generation {gen.id} did not freeze")
        frozen.append(gen)
    return Done(f"{len(frozen)} generations frozen")


def thaw_trees(store: Store, supervisor: Supervisor, host: str) -> Done:
    """Every live generation of `host` thawed (one not frozen is left as it is)."""
    live = [g for g in store.generations.live_generations(host) if g.service != REPLICA]
    for gen in live:
        supervisor.thaw(gen)
    return Done(f"{len(live)} generations thawed")


def thaw_steps() -> tuple[PlannedStep, ...]:
    """A frozen instance's wake (keelway/deploy/parking.py `plan_wake`)."""
    return (
        PlannedStep(StepKind.THAW, "thaw every process of it", "thaw",
                    before=("thaw.before",), after=("thaw.after",)),
        PlannedStep(StepKind.THAW_ROUTE, "its route serving again, in one write", "unfrozen",
                    before=("thaw.route.before",), after=("thaw.route.after",)),
        PlannedStep(StepKind.PUBLISH, "publish the route table (the held requests go)",
                    "publish-thawed"))


FREEZE: Spec[FreezeRequest, Freezing] = Spec(
    OpKind.FREEZE, plan_freeze, {"route": _route, "publish": _publish, "freeze": _freeze},
    fence_verb=None)
