"""Every operation a plan: a spec per operation kind, and the one runner that carries
any of them out.

A spec (`Spec`) says what an operation of its kind is: its `OpKind`, what it locks, the
verb a held fence refuses it with (None: a fence does not refuse it), a pure
`plan(store, request) -> Plan` that only reads, the effect bound to each planned step,
and how an interrupted operation of the kind is finalized (`finalize`, called by the
reconciler, keelway/reconcile/plan.py). A plan is the ordered list of steps the runner
journals, each with its `StepKind`, one line for `--dry-run`, its failpoints and its
service / generations, so `--dry-run` prints exactly what the runner would run.

The runner (`Runner.run`) is the one sequence every operation goes through:
name check → the lock → converge (Pass.MUTATION) → the fence → plan → begin (journal)
→ each step: journal write, `before` failpoints, effect, `after` failpoints, outcome
(keelway/deploy/steps.py) → the replication hook → finish → converge again (if the
kind says so). Invariants:
- Nothing is written before the operation is begun: a plan that refuses (a bad state)
  or has nothing to do (`Plan.nothing`) leaves no operation behind.
- An operation is live (`Locks.live_ops`, which the reconciler leaves alone) exactly
  while this runner runs it; its outcome is written once, after its work
  (`finish.before` is the last window).
- A step whose effect says `Failed` stops the plan: the operation fails with that
  reason, and later steps are never journaled. `Ended` stops it with a whole `Result`
  (an attempt's outcome, a deferral).
- An exception raised inside the work is journaled as a `fault` step and the instance
  converged at once, as after a crash: its effects are in an unknown state.
- A dynamic step (`PlannedStep.journals_own`) writes no step of its own: its effect
  journals the steps it decides as it goes (an attempt's spawns and fallback, a respawn
  of ACTIVE), through the same `Steps` runner, so the crash windows are the same.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, assert_never

from keelway import failpoints
from keelway.deploy import fences, targets
from keelway.deploy.errors import OperationError
from keelway.deploy.locks import Locks
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.steps import Done, Failed, Steps
from keelway.durable import sync_deferred
from keelway.journal import REPLICA, OpKind, StepKind
from keelway.reconcile.apply import end_interrupted
from keelway.reconcile.plan import Finalize, Pass, Verdict, by_steps
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import OpState, StepState
from keelway.store.records import Operation

log = logging.getLogger("keelway.deployer")

# A step a crash left pending in an operation that boot carried on (`Spec.recover`).
CARRIED_ON = "interrupted by a control-plane crash; the operation was carried on at boot"

failpoints.declare("finish.before")


@dataclass(frozen=True)
class Ended:
    """A dynamic step ends the plan here with this outcome (done or not): what an
    attempt run inside another operation decided, say."""

    result: Result
    # On a journaled step: its detail; the step is written failed (with the result's
    # reason) unless the result is DONE.
    detail: str | None = None


# The effect bound to one planned step. It is given the operation it runs in (a dynamic
# step journals its own steps of it) and says how it went as a value.
Bound = Callable[[Operation], Awaitable[Done | Failed | Ended]]


@dataclass(frozen=True)
class PlannedStep:
    """One step of a plan: what the journal will say of it, and where it can crash.

    `effect` names the spec's effect that carries it out (`Spec.effects`); `arg` is the
    effect's one parameter the plan decided (a generation id, a release number)."""

    kind: StepKind
    describe: str
    effect: str
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    service: str | None = None
    before_gen: int | None = None
    after_gen: int | None = None
    arg: int | None = None
    # Written with the step at its begin (a run's program name).
    detail: str | None = None
    # The effect journals its own steps (an attempt, a respawn): no step is written for
    # it, and `kind` is the first step it writes.
    journals_own: bool = False

    def as_json(self) -> dict[str, object]:
        shown: dict[str, object] = {"step": self.kind.value, "describe": self.describe}
        if self.service is not None:
            shown["service"] = self.service
        if self.before_gen is not None:
            shown["before_gen"] = self.before_gen
        if self.after_gen is not None:
            shown["after_gen"] = self.after_gen
        if self.before or self.after:
            shown["failpoints"] = [*self.before, *self.after]
        if self.journals_own:
            shown["dynamic"] = True
        return shown


@dataclass(frozen=True)
class Plan:
    """What an operation of `kind` on `host` would do, from the records alone.

    `nothing`: why there is nothing to do (no operation is journaled; the caller says
    so). Otherwise the runner journals exactly `steps`, in order."""

    kind: OpKind
    app: str
    host: str
    steps: tuple[PlannedStep, ...] = ()
    nothing: str | None = None

    def lines(self) -> list[str]:
        """The plan as `--dry-run` prints it, one line per step."""
        if self.nothing is not None:
            return [f"{self.kind.value} {self.host}: nothing to do ({self.nothing})"]
        return [f"{self.kind.value} {self.host}:"] + [
            f"  {n}. {s.kind.value}: {s.describe}" for n, s in enumerate(self.steps, 1)]

    def as_json(self) -> dict[str, object]:
        return {"op": self.kind.value, "app": self.app, "instance": self.host,
                "nothing": self.nothing, "steps": [s.as_json() for s in self.steps]}


class Locking(enum.Enum):
    """What an operation of a kind holds while it runs."""

    INSTANCE = "instance"  # its instance's lock
    # Its app's lock around its instance's (a rollout: release numbers never interleave).
    APP = "app"


class OnInstance(Protocol):
    """What every operation is asked about: the instance it acts on."""

    @property
    def host(self) -> str: ...


Req = TypeVar("Req", bound=OnInstance)
Parts = TypeVar("Parts")
T = TypeVar("T")

# The effects of a kind, by the name a planned step gives: each is bound to the parts
# it uses, the request, and the planned step it carries out.
EffectOf = Callable[[Parts, Req, PlannedStep], Bound]


@dataclass(frozen=True)
class Spec(Generic[Req, Parts]):
    """One operation kind. `plan` only reads the store; `effects` carry its steps out;
    `finalize` decides an interrupted one's end from its journal (the reconciler calls
    it, never the runner)."""

    kind: OpKind
    plan: Callable[[Store, Req], Plan]
    effects: Mapping[str, EffectOf[Parts, Req]]
    locks: Locking = Locking.INSTANCE
    # A held fence refuses it, saying "it cannot <verb>"; None: fences do not refuse it.
    fence_verb: str | None = None
    # Reconcile once more after its outcome is written (a fault converged already).
    converge_after: bool = False
    finalize: Callable[[Operation], Verdict] = by_steps
    # Its interrupted operations are never their instance's latest (a run), or outlive
    # their instance (a removal): the boot pass finds them by kind and ends them by
    # `finalize` (keelway/reconcile/apply.py `finalize_orphans`).
    orphaned: bool = False
    # Converge the instance (Pass.MUTATION) before the fence check and the plan; False
    # for an operation whose caller converged under a lock it holds.
    converge_first: bool = True
    # Under the lock, after the fence check, before the plan and before the operation
    # begins: a check that may refuse with nothing journaled (a seed verified again),
    # or a copy staged (a restore's).
    prelude: Callable[[Parts, Req], Awaitable[None]] | None = None
    # The durable intent the operation carries (a removal's `removing` mark), written
    # in the same write that begins it (`Store.begin_with`): every mark has the
    # operation whose journal says how far it got, so `recover` finds it.
    intent: Callable[[Parts, Req], object] | None = None
    # Inside the operation, after its last step and before its outcome: work that is
    # operations of its own (an add's starts, each an attempt), so the intent stays open
    # until it is done.
    closing: Callable[[Parts, Req, Operation], Awaitable[None]] | None = None
    # Written in the same write that ends a DONE operation (`Store.finish_with`): the
    # intent cleared (an add's `adding`), so a mark never outlives its operation.
    ending: Callable[[Parts, Req], object] | None = None
    # Under the same lock once the operation ended (seeing how, `Ran`), never
    # journaled: what is derived from the records and rewritten whole (the `current`
    # link), or a follow-up operation run with `run_held`.
    after: Callable[[Parts, Req, Ran], Awaitable[None]] | None = None
    # At boot, once every instance is reconciled: an interrupted operation of this kind
    # carried on (rolled forward, or back) from its journal and the intent it carries,
    # and ended. The reconciler's passes leave such an operation unfinalized for it (a
    # crash between the two would lose the carry-on): see `Recovery`. Declared on one
    # spec of the kind, bound to its part at wiring.
    recover: Callable[[Parts, Operation], Awaitable[None]] | None = None
    # At boot, before anything respawns or is reconciled: what the kind must settle
    # first (a restore's committed swap finished, so the instance comes back on the
    # restored database).
    first: Callable[[Parts], None] | None = None


@dataclass(frozen=True)
class Ran:
    """What the runner did: the plan it ran, and how the operation ended (None: the
    plan had nothing to do and nothing was journaled)."""

    plan: Plan
    result: Result | None

    @property
    def done(self) -> bool:
        return self.result is None or self.result.outcome is Outcome.DONE


class Converger(Protocol):
    """Reconcile one instance under the lock its caller holds (keelway/deploy/passes.py)."""

    async def converge(self, host: str, mode: Pass) -> None: ...


class ReplicaHook(Protocol):
    """The replica keeper (keelway/deploy/replica_keeper.py), as the runner calls it
    after every operation's work."""

    async def keep_replica(self, op: Operation, host: str) -> str | None:
        """Start or sync-and-stop `host`'s replicator as the instance now wants, as steps
        of `op`; what failed there (already a warning of `op`), if anything."""
        ...


class _SetByWire(Generic[T]):
    """A collaborator of the parts' one cycle, set once by `wire` (keelway/api/daemon.py);
    reading it before that is a wiring bug, said as such."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, part: object, owner: type | None = None) -> T:
        value: T | None = vars(part).get(self.name)
        assert value is not None, f"wire() sets the {self.name}"
        return value

    def __set__(self, part: object, value: T) -> None:
        vars(part)[self.name] = value


@dataclass(eq=False)
class Runner:
    """The one way an operation runs (see the module header)."""

    # The one cycle of the parts: a fault converges, converging may restart what ACTIVE
    # names, and that restart is itself an operation of this runner; and the replica
    # keeper runs its own operation. Both set once at wiring (keelway/api/daemon.py).
    converger = _SetByWire[Converger]()
    replica_hook = _SetByWire[ReplicaHook]()

    store: Store
    locks: Locks
    owner: str
    # Hosts whose lock an effect has lent out (`lent`), and how many times over.
    _lent: dict[str, int] = field(default_factory=dict)

    def busy(self, host: str) -> bool:
        """Whether an operation holds `host`'s lock now, or has lent it out (a one-off
        runs there: parking would stop it under its user): the idle sweep leaves it be."""
        return self.locks.instance(host).locked() or self._lent.get(host, 0) > 0

    @contextlib.asynccontextmanager
    async def lent(self, host: str) -> AsyncIterator[None]:
        """Inside an effect: lend `host`'s lock out (a one-off run may run for hours, and
        operations on the instance go on meanwhile), and take it back before the step's
        outcome is written. The operation stays live throughout."""
        lock = self.locks.instance(host)
        lock.release()
        self._lent[host] = self._lent.get(host, 0) + 1
        try:
            yield
        finally:
            self._lent[host] -= 1
            if not self._lent[host]:
                del self._lent[host]
            await lock.acquire()

    def dry_run(self, spec: Spec[Req, Parts], request: Req) -> Plan:
        """The plan the runner would run now, from the records alone; nothing is locked,
        converged or written. Refusals raise as the run would (a bad name, a fence)."""
        if request.host:
            targets.instance_named(self.store, request.host)
        if request.host and spec.fence_verb is not None:
            fences.refuse_if_fenced(self.store, request.host, spec.fence_verb)
        return spec.plan(self.store, request)

    async def run(self, spec: Spec[Req, Parts], parts: Parts, request: Req, *,
                  key: str | None = None, request_digest: str | None = None,
                  schedule_rev: int = 0, begun: Operation | None = None) -> Ran:
        """Lock, converge, refuse a fence, `prelude`, plan, run the plan as one
        operation, then `after`, all under the lock.

        After return the operation (if any) is terminal and the lock released. A plan
        that refuses raises its error with nothing journaled (what `prelude` wrote
        stays: it is an intent the next boot carries on from). An operation of no
        instance (`host == ""`: an app's own) takes the lock of that empty name and
        converges nothing.

        `begun`: an operation of this kind already begun (an add's, begun with its
        records), or an interrupted one carried on at boot (`Spec.recover`): the plan
        runs as its further steps, and it ends as the plan does."""
        host = request.host
        async with contextlib.AsyncExitStack() as held:
            if host:
                inst = targets.instance_named(self.store, host)
                match spec.locks:
                    case Locking.APP:
                        await held.enter_async_context(self.locks.app(inst.app))
                    case Locking.INSTANCE:
                        pass
                    case _:
                        assert_never(spec.locks)
                await held.enter_async_context(self.locks.instance(host))
                if spec.converge_first:
                    await self.converger.converge(host, Pass.MUTATION)
                if spec.fence_verb is not None:
                    fences.refuse_if_fenced(self.store, host, spec.fence_verb)
            else:
                await held.enter_async_context(self.locks.instance(host))
            if spec.prelude is not None:
                await spec.prelude(parts, request)
            ran = await self.run_held(spec, parts, request, key=key,
                                      request_digest=request_digest,
                                      schedule_rev=schedule_rev, begun=begun)
            if spec.after is not None:
                await spec.after(parts, request, ran)
        return ran

    async def run_held(self, spec: Spec[Req, Parts], parts: Parts, request: Req, *,
                       key: str | None = None, request_digest: str | None = None,
                       schedule_rev: int = 0, begun: Operation | None = None) -> Ran:
        """Plan and run under the lock the caller holds, converged already (the
        reconciler's passes, a crash restart, the steps of a rollout)."""
        plan = spec.plan(self.store, request)
        if plan.nothing is not None:
            if begun is not None:
                # Nothing is left to carry on: it ends as its journal says.
                end_interrupted(self.store, begun, by_steps(begun))
            return Ran(plan, None)
        bound = [(step, spec.effects[step.effect](parts, request, step))
                 for step in plan.steps]

        async def work(op: Operation) -> Result:
            result = await _run_steps(self.store, op, bound)
            if spec.closing is not None and result.outcome is Outcome.DONE:
                await spec.closing(parts, request, op)
            return result

        intent = spec.intent
        ending = spec.ending
        result = await self.journaled(
            plan.app, plan.host, spec.kind, work, key=key, request_digest=request_digest,
            schedule_rev=schedule_rev, converge_after=spec.converge_after, begun=begun,
            intent=None if intent is None else lambda: intent(parts, request),
            ending=None if ending is None else lambda: ending(parts, request))
        return Ran(plan, result)

    async def journaled(self, app: str, host: str, kind: OpKind,
                        work: Callable[[Operation], Awaitable[Result]], *,
                        key: str | None = None, request_digest: str | None = None,
                        schedule_rev: int = 0, converge_after: bool = False,
                        begun: Operation | None = None,
                        intent: Callable[[], object] | None = None,
                        ending: Callable[[], object] | None = None) -> Result:
        """Run `work` as one journaled operation owned by this control plane, under
        `host`'s lock (held by the caller). A crash inside `work` leaves it unfinished,
        for the reconciler to finalize (its kind's `finalize`); an exception is
        journaled as a fault and converged at once. `converge_after` reconciles once
        more after an outcome that was written (a fault has converged already).

        `intent` is written in the write that begins it, `ending` in the one that ends
        it DONE; `begun` is the operation to run `work` in instead of a new one."""
        # Its end is durable before its caller is told; an operation whose effects end
        # with the box writes without an fsync of its own, and is made durable at its
        # end by `Store.sync`, one fsync off the loop for all that end together
        # (keelway/durable.py). Any durable commit between covers what came before it.
        deferred = kind.ends_with_the_box
        with sync_deferred(deferred):
            if begun is not None:
                op = self._carried_on(begun)
            elif intent is not None:
                op = self.store.begin_with(intent, app, host, kind, self.owner, key=key,
                                           request_digest=request_digest,
                                           schedule_rev=schedule_rev)
            else:
                op = self.store.ops.begin_operation(app, host, kind, self.owner, key=key,
                                                    request_digest=request_digest,
                                                    schedule_rev=schedule_rev)
        self.locks.live_ops.add(op.id)
        faulted = False
        try:
            with sync_deferred(deferred):
                result = await self._work(op, host, kind, work)
        except OperationError as exc:
            result = Result(Outcome.FAILED, exc.message)
        except Exception as exc:
            result, faulted = Result(Outcome.FAILED, self._record_fault(op, exc)), True
        finally:
            self.locks.live_ops.discard(op.id)
        if faulted:
            await self._converge_fault(host)
        else:
            self._finish(op, result, ending, deferred)
            if deferred:
                await self.store.sync()
            if converge_after:
                await self.converger.converge(host, Pass.MUTATION)
        return result

    async def _work(self, op: Operation, host: str, kind: OpKind,
                    work: Callable[[Operation], Awaitable[Result]]) -> Result:
        result = await work(op)
        # The one hook of replication (keelway/data/replicas.py): after any operation,
        # the replicator follows what the instance now is (running: started once its
        # web is; parked or stopped: synced and stopped, proven gone), as steps of this
        # same operation, so every place that brings an instance up or down is covered
        # without a call of its own. It changes the outcome of a `replicate` operation
        # only (its whole work): what any other did to traffic is done, and the
        # reconciler keeps the replicator.
        failed = await self.replica_hook.keep_replica(op, host)
        if failed is not None and kind is OpKind.REPLICATE and (
                result.outcome is Outcome.DONE):
            result = Result(Outcome.FAILED, failed)
        return result

    def _carried_on(self, op: Operation) -> Operation:
        """An interrupted operation about to run on: each step the crash left pending
        ended failed, as interrupted, so its journal says where the crash was and what
        was done after it."""
        for step in op.steps:
            if step.state is StepState.PENDING:
                self.store.ops.finish_step(op.id, step.seq, StepState.FAILED,
                                           error=CARRIED_ON)
        return self.store.ops.get_operation(op.id) or op

    def _finish(self, op: Operation, result: Result,
                ending: Callable[[], object] | None = None, deferred: bool = False) -> None:
        """The operation's end and its event written: durably, or (`deferred`) for the
        caller's `Store.sync` to make durable."""
        failpoints.hit("finish.before")
        with sync_deferred(deferred):
            latest = self.store.ops.get_operation(op.id) or op
            if not latest.terminal:
                if result.outcome is Outcome.DONE and ending is not None:
                    self.store.finish_with(ending, latest, OpState.SUCCEEDED)
                elif result.outcome is Outcome.DONE:
                    self.store.ops.finish_operation(latest, OpState.SUCCEEDED)
                else:
                    self.store.ops.finish_operation(latest, OpState.FAILED,
                                                    error=result.reason)
            message = f"{op.kind} {'succeeded' if result.outcome is Outcome.DONE else 'failed'}"
            if result.reason:
                message += f": {result.reason}"
            self.store.ops.add_event("op", message, app=op.app, instance=op.instance)

    def _record_fault(self, op: Operation, exc: Exception) -> str:
        """Journal an exception raised inside `op` as a failed `fault` step; returns the
        error as the operation's outcome will say it. Call from the `except` block.

        `except Exception` around an operation is the journal's edge, like the top of a
        loop: whatever went wrong, the journal must say it, never "a crash". The op stays
        unfinished, not live: the reconciler converges it (`_converge_fault`).
        """
        log.exception("op %d %s on %s raised", op.id, op.kind, op.instance)
        error = f"{type(exc).__name__}: {exc}"
        try:
            latest = self.store.ops.get_operation(op.id) or op
            pending = [s.name for s in latest.steps if s.state is StepState.PENDING]
            if pending:
                error = f"{pending[-1]}: {error}"  # where it happened, then what
            seq = self.store.ops.begin_step(op.id, StepKind.FAULT)
            self.store.ops.finish_step(op.id, seq, StepState.FAILED, error=error)
        except Exception:
            # The store itself fails (a full disk, say): the op converges as interrupted,
            # and the caller still hears the real error.
            log.exception("op %d: could not journal its fault", op.id)
        return error

    async def _converge_fault(self, host: str) -> None:
        """Converge a faulted operation now, under the lock the caller holds, so it is
        terminal when the caller answers; a failure here is left to the next pass (the
        op stays unfinished and not live), and the caller still answers the fault."""
        try:
            await self.converger.converge(host, Pass.MUTATION)
        except OperationError as exc:
            log.warning("after a fault on %s: %s", host, exc.message)
        except Exception:
            # Whatever raised inside the operation may well raise here too (a full disk).
            log.exception("after a fault on %s: could not converge it yet", host)


async def _run_steps(store: Store, op: Operation,
                     bound: Sequence[tuple[PlannedStep, Bound]]) -> Result:
    """Each planned step in order: a journaled one through `Steps.run` (its journal
    write, its failpoints around its effect, its outcome), a dynamic one as its effect
    journals it. The first `Failed` or `Ended` ends the plan."""
    steps = Steps(store, op.id)
    for step, effect in bound:
        if step.journals_own:
            end = await effect(op)
        else:
            end = await _journaled_step(steps, op, step, effect)
        match end:
            case Done():
                continue
            case Failed(reason=reason):
                return Result(Outcome.FAILED, reason)
            case Ended(result=result):
                return result
            case _:
                assert_never(end)
    return Result(Outcome.DONE)


async def _journaled_step(steps: Steps, op: Operation, step: PlannedStep,
                          effect: Bound) -> Done | Failed | Ended:
    ended: list[Ended] = []

    async def run() -> Done | Failed:
        end = await effect(op)
        if isinstance(end, Ended):
            ended.append(end)
            if end.result.outcome is not Outcome.DONE:
                return Failed(end.result.reason or end.result.outcome.value)
            return Done(end.detail)
        return end

    failed = await steps.run(step.kind, run, before=step.before, after=step.after,
                             service=step.service, before_gen=step.before_gen,
                             after_gen=step.after_gen, detail=step.detail)
    if ended:
        return ended[0]
    return Done() if failed is None else failed


# -- steps several kinds plan -----------------------------------------------------


def stop_steps(store: Store, host: str) -> tuple[PlannedStep, ...]:
    """A STOP step for each live generation of `host` but the replicator (stopped after
    the app with a last sync, by the replication hook), bound to `stop_generation`
    under the effect name `stop`."""
    return tuple(
        PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id} and prove it "
                    "gone", "stop", service=gen.service, before_gen=gen.id)
        for gen in store.generations.live_generations(host) if gen.service != REPLICA)


def stop_generation(store: Store, supervisor: Supervisor, step: PlannedStep) -> Bound:
    """A STOP step's effect: the generation it names stopped with its own grace and
    proven gone (one whose record is gone already is done)."""
    async def stop(_op: Operation) -> Done | Failed:
        assert step.before_gen is not None
        gen = store.generations.get_generation(step.before_gen)
        if gen is None:
            return Done("no record")
        return await targets.stop_effect(store, supervisor, gen)()

    return stop


@dataclass(frozen=True)
class Finalizers:
    """How the reconciler finalizes an interrupted operation of each kind: the spec's
    `finalize` by kind, the journal's step rule (`by_steps`) for a kind with none, and
    nothing (None) for a kind its spec carries on at boot (`Spec.recover`): that one
    stays unfinalized until `Recovery` has carried it on."""

    by_kind: Mapping[OpKind, Finalize] = field(default_factory=dict)
    orphaned: frozenset[OpKind] = frozenset()
    carried: frozenset[OpKind] = frozenset()

    def __call__(self, op: Operation) -> Verdict | None:
        if op.kind in self.carried:
            return None
        return self.by_kind.get(op.kind, by_steps)(op)


def finalizers(*specs: Spec[Any, Any]) -> Finalizers:
    """The reconciler's finalizer of every kind these specs describe."""
    return Finalizers({spec.kind: spec.finalize for spec in specs},
                      frozenset(spec.kind for spec in specs if spec.orphaned),
                      frozenset(spec.kind for spec in specs if spec.recover is not None))


Recover = Callable[[Operation], Awaitable[None]]


@dataclass(frozen=True)
class Recovery:
    """What boot does with the interrupted operations of the kinds whose specs carry
    them on (`Spec.recover`, `Spec.first`), each bound to its part: one dispatch by
    kind, the same for every kind (keelway/deploy/passes.py `Passes.boot`)."""

    by_kind: Mapping[OpKind, Recover] = field(default_factory=dict)
    first: tuple[Callable[[], None], ...] = ()

    def settle_first(self) -> None:
        for settle in self.first:
            settle()

    def interrupted(self, store: Store, live_ops: set[int]) -> list[Operation]:
        """Every operation not terminal and not live of a kind carried on here, oldest
        first: each instance's latest of these kinds (also when a later operation of
        another kind superseded it as the instance's latest: an add's, once its starts
        began; a seed rollback's, once the restart it began after its unfence), and
        those whose instance is gone."""
        kinds = set(self.by_kind)
        found = {op.id: op for op in store.ops.latest_operations_of(kinds)}
        for op_id in store.ops.unfinished_operations():  # their instance gone
            if (gone := store.ops.get_operation(op_id)) is not None:
                found[op_id] = gone
        return [op for _, op in sorted(found.items())
                if op.kind in kinds and not op.terminal and op.id not in live_ops]

    async def recover_all(self, store: Store, live_ops: set[int]) -> list[int]:
        """Carry on each interrupted operation by its kind's `recover`; the ids carried
        on. One that cannot be carried on now stays unfinished for the next boot."""
        carried = []
        for op in self.interrupted(store, live_ops):
            fresh = store.ops.get_operation(op.id)
            if fresh is None or fresh.terminal:
                continue  # an earlier one's carry-on ended it (a destroy's instances)
            try:
                await self.by_kind[op.kind](fresh)
            except OperationError as exc:
                log.warning("boot: op %d %s on %s: %s; the next boot carries it on",
                            op.id, op.kind, op.instance or op.app, exc.message)
                continue
            carried.append(op.id)
        return carried


def recovery(*bound: tuple[Spec[Any, Any], Any]) -> Recovery:
    """The boot recovery of every spec that declares one, each with its part."""
    by_kind: dict[OpKind, Recover] = {}
    first: list[Callable[[], None]] = []
    for spec, parts in bound:
        if spec.recover is not None:
            by_kind[spec.kind] = functools.partial(spec.recover, parts)
        if spec.first is not None:
            first.append(functools.partial(spec.first, parts))
    return Recovery(by_kind, tuple(first))
