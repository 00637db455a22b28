"""Carrying out a reconciliation plan: the only place the reconciler has effects.

Each action is idempotent and leaves a mark (a converged step, a finished operation,
a gone generation), so a crash in the middle of `apply` and a second pass afterwards
end where one whole pass would have. A candidate that cannot be removed stops the pass
and fails the instance closed (`FailedClosed`), with the leftover in the journal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, assert_never

from keelway import failpoints
from keelway.home import Home
from keelway.journal import REPLICA, Inhibition, OpKind
from keelway.reconcile.plan import (
    Action,
    Finalize,
    Kind,
    Observed,
    Pass,
    Records,
    Verdict,
    by_steps,
    plan,
)
from keelway.runtime import process
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, OpState, RouteState, StepState
from keelway.store.records import Generation, InstanceView, Operation, Presence

log = logging.getLogger("keelway.reconcile")

failpoints.declare("reconcile.remove.before", "reconcile.remove.after",
                   "reconcile.finalize.before")

Grace = Callable[[Generation], float]


class ActiveRestarts(Protocol):
    """What a pass asks of the crash restarts: bring back what ACTIVE names on `host`
    (journaled as its own operation), under the lock the pass holds."""

    async def restart_active(self, host: str) -> None: ...


class ReplicaUpkeep(Protocol):
    """What a pass asks of the replica keeper, under the lock the pass holds."""

    async def start_replica(self, host: str) -> None:
        """Start `host`'s replicator (keelway/data/replicas.py) as its own operation."""
        ...

    async def sync_replica(self, host: str) -> None:
        """After the pass stopped `host`'s replicator or found it dead: the last sync of
        its replica if the instance does not run (a park or stop interrupted before its
        own)."""
        ...


class FailedClosed(Exception):
    """A candidate could not be removed: no mutation of the instance may proceed."""

    def __init__(self, host: str, leftover: str) -> None:
        super().__init__(f"{host} is failed closed: {leftover}")
        self.host = host
        self.leftover = leftover


@dataclass
class Convergence:
    """What one reconcile did, and whether the route table must be published."""

    actions: list[Action] = field(default_factory=list)
    republish: bool = False


def end_interrupted(store: Store, op: Operation, verdict: Verdict,
                    detail: str | None = None) -> None:
    """End an interrupted operation no instance's plan finalizes (its instance gone,
    never the latest, or one its kind's recovery carried on) as `verdict` says: its
    pending steps, then the operation itself, then the event. Each write is idempotent
    and the operation's is the last: a crash midway is redone."""
    done = verdict.state is OpState.SUCCEEDED
    for step in op.steps:
        if step.state is StepState.PENDING:
            store.ops.finish_step(op.id, step.seq,
                                  StepState.SUCCEEDED if done else StepState.FAILED,
                                  detail=detail if done else None,
                                  error=None if done else verdict.reason)
    latest = store.ops.get_operation(op.id) or op
    if latest.terminal:
        return
    store.ops.finish_operation(latest, verdict.state, error=verdict.reason)
    store.ops.add_event("reconcile", f"op {op.id} {op.kind} finalized "
                        f"{verdict.state.value}" + (f": {verdict.reason}"
                                                    if verdict.reason else ""),
                        app=op.app, instance=op.instance)


def gather(store: Store, host: str, live_ops: set[int],
           replicate: bool = False) -> Records | None:
    inst = store.instances.get_instance(host)
    if inst is None:
        return None
    live = store.generations.live_generations(host)
    return records_of(InstanceView(
        instance=inst, latest=store.ops.latest_operation(host),
        active={a.service: a.generation_id for a in store.generations.list_active(host)}, live=live,
        inhibitions={g.id: frozenset(store.generations.inhibitions(g.id)) for g in live},
        route=store.routes.get_route(host), fenced=store.instances.fenced(
            host)), live_ops, replicate)


def records_of(view: InstanceView, live_ops: set[int], replicate: bool = False) -> Records:
    """The planner's records of one instance, from one instance's view of the store."""
    host = view.instance.host
    return Records(
        instance=view.instance,
        latest=view.latest,
        latest_is_live=view.latest is not None and view.latest.id in live_ops,
        active=dict(view.active),
        live=list(view.live),
        inhibitions=dict(view.inhibitions),
        routed={host: view.route.generation_id if view.route else None},
        route_state=view.route.state if view.route else None,
        fenced=view.fenced,
        owned=frozenset(g.id for g in view.live if g.op_id is not None and g.op_id in live_ops
                        and (view.latest is None or g.op_id != view.latest.id)),
        replicate=replicate,
    )


def observe(records: Records, supervisor: Supervisor,
            presences: Mapping[int, Presence]) -> Observed:
    """What /proc (and the cgroups) say of the generations the records name, whose
    leaders `presences` holds (store.local's bulk read). A tree is
    looked at only for a generation whose leader is dead or unrecorded: the common case
    costs one stat read per generation."""
    return observe_all([records], supervisor, presences)[0]


def observe_all(all_records: Sequence[Records], supervisor: Supervisor,
                presences: Mapping[int, Presence]) -> list[Observed]:
    """`observe` for many instances at once: the trees of all their generations whose
    leader is dead or unrecorded looked at together (one read of /proc for those with
    no cgroup, however many: a survey during a rollout meets hundreds just planned)."""
    live = [g for records in all_records for g in records.live]
    leaders = {g.id: presences[g.id].leader for g in live}
    alive = {g.id for g in live if (leader := leaders[g.id]) is not None
             and process.is_alive(*leader)}
    orphans = supervisor.trees.with_members(
        {g.id: leaders[g.id] for g in live if g.id not in alive})
    watched = {g.id for g in live if supervisor.is_watched(g.id)}
    observed = []
    for records in all_records:
        mine = {g.id for g in records.live}
        observed.append(Observed(frozenset(alive & mine), frozenset(watched & mine),
                                 frozenset(orphans & mine)))
    return observed


@dataclass(eq=False)
class Reconciler:
    store: Store
    supervisor: Supervisor
    home: Home
    restarts: ActiveRestarts
    replicas: ReplicaUpkeep
    grace: Grace  # the service's stop_grace: SIGTERM, then SIGKILL after this
    # How an interrupted operation ends, by its kind (keelway/deploy/operation.py
    # `Finalizers`: each spec's `finalize`), and the kinds whose interrupted
    # operations no instance's plan sees (a run is never the latest; a removal's
    # instance is gone) that `finalize_orphans` ends by it.
    finalize: Finalize = by_steps

    def __post_init__(self) -> None:
        self.orphan_kinds: frozenset[OpKind] = frozenset()
        # Set by the deploy side when databases are replicated (keelway/data/replicas.py).
        self.replicate = False

    def plan_for(self, host: str, mode: Pass, live_ops: set[int]) -> list[Action]:
        records = gather(self.store, host, live_ops, self.replicate)
        if records is None:
            return []
        return plan(records, observe(records, self.supervisor, self.store.local.presences(
            g.id for g in records.live)), mode, self.finalize)

    def survey(self, mode: Pass, live_ops: set[int],
               store: Store | None = None) -> tuple[list[str], bool]:
        """The instances whose plan does more than republish, planned from one bulk read
        (what boot and the periodic pass lock and reconcile afresh), and whether any
        plan asks to republish. An idle instance (stopped, or running and settled)
        costs its share of a handful of queries, one liveness check per generation
        and no lock. `store`: where to read (the periodic pass reads apart from the
        loop, `Store.read_apart`); what it finds is only where to look again, under
        each instance's lock."""
        store = store or self.store
        hosts, republish = [], False
        views = store.instances.instance_views()
        presences = store.local.presences(g.id for view in views for g in view.live)
        planned: list[tuple[InstanceView, Records]] = []
        for view in views:
            try:
                planned.append((view, records_of(view, live_ops, self.replicate)))
            except Exception:
                hosts.append(view.instance.host)  # as a plan that raises, below
        observed = observe_all([r for _, r in planned], self.supervisor, presences)
        for (view, records), seen in zip(planned, observed, strict=True):
            try:
                actions = plan(records, seen, mode, self.finalize)
            except Exception:
                # One instance's records must not keep the others from their pass: it is
                # reconciled alone, where its error is reported as its own.
                hosts.append(view.instance.host)
                continue
            if any(a.kind is not Kind.REPUBLISH for a in actions):
                hosts.append(view.instance.host)
            republish = republish or any(a.kind is Kind.REPUBLISH for a in actions)
        return hosts, republish

    async def reconcile(self, host: str, mode: Pass, live_ops: set[int]) -> Convergence:
        """Plan and apply for one instance; the caller holds (or tried) its lock."""
        actions = self.plan_for(host, mode, live_ops)
        outcome = Convergence(actions)
        restart = replicate = synced = False
        for action in actions:
            match action.kind:
                case Kind.KEEP_CANDIDATE:
                    assert action.op_id is not None and action.seq is not None
                    self.store.ops.converge_step(
                        action.op_id, action.seq,
                        f"converged: published generation {action.generation} kept",
                        fail_with=action.reason)
                case Kind.REMOVE_CANDIDATE:
                    await self._remove_candidate(host, action)
                case Kind.CLEAR_INHIBITION:
                    assert action.generation is not None and action.reason is not None
                    # The plan names the mark by its value (Action.reason is shared text).
                    self.store.generations.remove_inhibition(action.generation,
                                                             Inhibition(action.reason))
                case Kind.FINALIZE:
                    assert action.op_id is not None and action.state is not None
                    op = self.store.ops.get_operation(action.op_id)
                    if op is not None and not op.terminal:
                        failpoints.hit("reconcile.finalize.before")
                        self.store.ops.finish_operation(op, action.state, error=action.reason)
                        self.store.ops.add_event("reconcile", f"op {op.id} {op.kind} finalized "
                                                 f"{action.state.value}", app=op.app, instance=host)
                case Kind.MARK_DOWN:
                    inst = self.store.instances.get_instance(host)
                    if inst is not None and inst.state is not InstanceState.DOWN:
                        self.store.take_out_of_service(host, InstanceState.DOWN, action.reason)
                        outcome.republish = True
                case Kind.RECORD_GONE:
                    assert action.generation is not None
                    await self.supervisor.bury(action.generation, None)
                    synced = synced or action.service == REPLICA
                case (Kind.REMOVE_STRAY | Kind.RETIRE | Kind.REMOVE_DESCENDANTS
                      | Kind.STOP_ACTIVE | Kind.STOP_REPLICA):
                    gen = self._gen(action)
                    if gen is not None and not await self.supervisor.stop(gen, self.grace(gen)):
                        pid = self.store.local.presence(gen.id).pid
                        self.store.ops.add_event("leftover", f"{gen.service} generation {gen.id} "
                                                 f"(pid {pid}) could not be stopped",
                                                 app=gen.app, instance=host)
                    elif action.kind is Kind.STOP_REPLICA:
                        synced = True
                case Kind.ADOPT:
                    gen = self._gen(action)
                    if gen is not None:
                        self.supervisor.adopt(gen)
                case Kind.RESTART_ACTIVE:
                    restart = True
                case Kind.START_REPLICA:
                    replicate = True
                case Kind.RESTORE_ROUTE:
                    gen = self._gen(action)
                    if gen is not None:
                        self.store.routes.set_route(host, host, RouteState.SERVING,
                                                    self.store.local.presence(gen.id).port,
                                                    gen.id,
                                                    expected=self.store.routes.get_route(host))
                        outcome.republish = True
                case Kind.REPUBLISH:
                    outcome.republish = True
                case _:
                    assert_never(action.kind)
        if restart:
            await self.restarts.restart_active(host)
        if replicate:
            await self.replicas.start_replica(host)
        if synced:
            await self.replicas.sync_replica(host)
        return outcome

    def finalize_orphans(self, live_ops: set[int]) -> list[int]:
        """End every interrupted operation of an `orphan_kinds` kind that no instance's
        plan sees (not its instance's latest, or its instance gone), by its kind's
        finalizer: its pending steps, then the operation itself. Run at boot after the
        instances are reconciled (a run's process was a stray of that pass). Each write
        is idempotent and the operation's is the last: a crash midway is redone."""
        ended = []
        candidates = [op.id for op in self.store.ops.unfinished_runs()]
        candidates += self.store.ops.unfinished_operations()
        for op_id in sorted(set(candidates)):
            op = self.store.ops.get_operation(op_id)
            if (op is None or op.terminal or op.id in live_ops
                    or op.kind not in self.orphan_kinds):
                continue
            latest = self.store.ops.latest_operation(op.instance)
            if latest is not None and latest.id == op.id:
                continue  # its instance's plan finalizes it
            verdict = self.finalize(op)
            if verdict is None:
                continue  # its kind's recovery carries it on at boot
            end_interrupted(self.store, op, verdict)
            ended.append(op.id)
        return ended

    def _gen(self, action: Action) -> Generation | None:
        assert action.generation is not None
        return self.store.generations.get_generation(action.generation)

    async def _remove_candidate(self, host: str, action: Action) -> None:
        assert action.op_id is not None and action.seq is not None
        gen = self._gen(action)
        gone = True
        if gen is not None:
            failpoints.hit("reconcile.remove.before")
            # A candidate whose pid a crash kept from the journal is found by its tree
            # (cgroup or environment) inside stop, like any other.
            gone = await self.supervisor.stop(gen, self.grace(gen))
            failpoints.hit("reconcile.remove.after")
        if not gone:
            assert gen is not None
            leftover = (f"{gen.service} generation {gen.id} "
                        f"(pid {self.store.local.presence(gen.id).pid}) of op "
                        f"{action.op_id} could not be removed")
            op = self.store.ops.get_operation(action.op_id)
            if op is not None:
                self.store.ops.add_warnings(op, [f"leftover: {leftover}"])
            raise FailedClosed(host, leftover)
        self.store.ops.converge_step(action.op_id, action.seq,
                                     f"converged: removed candidate {action.generation}",
                                     fail_with=action.reason)

