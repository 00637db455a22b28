"""What reconciling one instance must do, decided from records and observations alone.

The rules (SPEC §4 Reconciler, §5):
- The common case, a latest operation that succeeded and nothing stray, plans nothing.
- A candidate recorded by a step of the latest operation is kept when ACTIVE names it,
  and removed otherwise; a step is converged once, then never looked at again.
- A generation of a live operation that is not the latest (a one-off run) is its
  owner's; once its owner is gone (a crash), a live one is a stray to remove.
- An operation that is not terminal and not owned by a live task here was interrupted:
  it is finalized, succeeded only when every step had succeeded. One whose own code
  raised is converged the same way (its effects are as unknown as after a crash), but
  finalized with the error its `fault` step recorded, not as a crash.
- A candidate that cannot be removed fails the instance closed: the step stays
  unconverged and the operation unfinalized, so nothing newer can hide the leftover.
- Inhibitions: `replacement-pending` is stale once the candidate is converged (its old
  generation was proven gone before the candidate existed); `retirement-pending` stays
  while its successor is published, so the periodic pass retires the old generation
  once the successor is verified and routed.
- A hold-mode release that had executed and did not end published is never fallen
  back: the instance is marked down, so no path rebuilds the old build under its data.
- A parked instance runs nothing: an ACTIVE generation still alive (a park interrupted
  before its stops) is stopped, and nothing is restarted. A fenced instance has nothing
  restarted either.
- Interrupted convergence never touches traffic: only BOOT and PERIODIC passes adopt,
  restart and republish, through the verified start path.
- A generation is its whole process tree: one whose leader died while descendants live
  (a daemonizing app) is not gone; its descendants are removed before it is recorded
  gone, and an ACTIVE one is then restarted. A tree its own watcher is removing is left
  to that watcher.
- The replicator (service `replica`, keelway/data/replicas.py) is named by its own
  record, not by ACTIVE: exactly one is kept alive while its instance runs (an older
  second one is stopped), it is stopped when the instance does not run, and BOOT and
  PERIODIC passes start one (START_REPLICA) for a running, unfenced instance whose
  ACTIVE web is alive and that has none; never while an operation owns the instance.
  Its steps, which follow another operation's work, never decide that operation's
  outcome when a crash interrupts them (only a `replicate` operation's).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from keelway.journal import REPLICA, Inhibition, OpKind, StepKind
from keelway.store.lifecycle import InstanceState, OpState, RouteState, StepState
from keelway.store.records import Generation, Instance, Operation, Step

REPLICATOR_STEPS = frozenset({StepKind.REPLICA_START, StepKind.REPLICA_STOP})


class Pass(enum.Enum):
    """Which pass reconciles: what it may do beyond converging the journal."""

    BOOT = "boot"  # after a control-plane start: adopt, restart, republish
    MUTATION = "mutation"  # before an operation, under the lock: converge only
    PERIODIC = "periodic"  # the background pass: retire, restart, republish


@dataclass(frozen=True)
class Observed:
    """What /proc says of the generations the records name."""

    alive: frozenset[int]  # generation ids whose recorded pid + start time is alive
    watched: frozenset[int]  # generation ids this control plane already supervises
    # generation ids whose leader is dead or was never recorded (a crash between spawn
    # and record) but whose process tree still has a live member
    orphans: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Records:
    instance: Instance
    latest: Operation | None
    latest_is_live: bool
    active: dict[str, int]  # service -> generation id
    live: list[Generation]  # generations not recorded gone
    inhibitions: dict[int, frozenset[Inhibition]] = field(default_factory=dict)
    routed: dict[str, int | None] = field(default_factory=dict)  # route row: host -> gen
    route_state: RouteState | None = None
    fenced: bool = False
    # Generations a live operation here started that is not the latest one: a one-off
    # run (OpKind.RUN never is), whose process its operation stops and buries. Like
    # a live latest operation's candidates, they are their owner's, never strays.
    owned: frozenset[int] = frozenset()
    # Whether this control plane replicates databases (a litestream binary is there).
    replicate: bool = False


class Kind(enum.Enum):
    KEEP_CANDIDATE = "keep-candidate"
    REMOVE_CANDIDATE = "remove-candidate"
    CLEAR_INHIBITION = "clear-inhibition"
    FINALIZE = "finalize"
    MARK_DOWN = "mark-down"
    RECORD_GONE = "record-gone"
    REMOVE_STRAY = "remove-stray"
    REMOVE_DESCENDANTS = "remove-descendants"
    RETIRE = "retire"
    # An ACTIVE generation still alive on an instance that is not RUNNING (a stop, park
    # or take-down interrupted between its first write and its last stop): it is
    # stopped, and ACTIVE keeps naming it so a start or a wake respawns what ran.
    STOP_ACTIVE = "stop-active"
    ADOPT = "adopt"
    RESTART_ACTIVE = "restart-active"
    RESTORE_ROUTE = "restore-route"
    REPUBLISH = "republish"
    # The replicator: one more than one alive, or one of an instance that does not run,
    # is stopped; a running instance with none gets one (keelway/data/replicas.py).
    STOP_REPLICA = "stop-replica"
    START_REPLICA = "start-replica"


@dataclass(frozen=True)
class Action:
    kind: Kind
    generation: int | None = None
    op_id: int | None = None
    seq: int | None = None
    reason: str | None = None  # inhibition reason, step error, or why
    state: OpState | None = None
    service: str | None = None

    def describe(self) -> str:
        parts = [self.kind.value]
        if self.service:
            parts.append(self.service)
        if self.generation is not None:
            parts.append(f"generation {self.generation}")
        if self.op_id is not None:
            parts.append(f"op {self.op_id}" + (f" step {self.seq}" if self.seq else ""))
        if self.state is not None:
            parts.append(self.state.value)
        if self.reason:
            parts.append(f"({self.reason})")
        return " ".join(parts)


def steps_to_converge(op: Operation, interrupted: bool) -> list[Step]:
    """Steps whose candidate still needs a decision. A succeeded operation has none."""
    if op.state is OpState.SUCCEEDED:
        return []
    return [s for s in op.steps if s.after_gen is not None and not s.converged
            and (interrupted or op.terminal)]


@dataclass(frozen=True)
class Verdict:
    """How an interrupted operation ends: its state, and why when it failed."""

    state: OpState
    reason: str | None = None


# How an interrupted operation of a kind is finalized from its journal (its spec's
# `finalize`, keelway/deploy/operation.py); `by_steps` for a kind that says nothing;
# None: not by a pass, its kind's recovery carries it on at boot and ends it.
Finalize = Callable[[Operation], Verdict | None]


def by_steps(op: Operation) -> Verdict:
    """The journal's rule: succeeded only when it has steps and every one succeeded.
    The replicator's steps follow an operation's work (`keep_replica`), after its
    effect on traffic: one left pending or failed decides only a `replicate` op."""
    failed = [s for s in op.steps if s.state is not StepState.SUCCEEDED
              and (op.kind is OpKind.REPLICATE or s.kind not in REPLICATOR_STEPS)]
    if op.steps and not failed:
        return Verdict(OpState.SUCCEEDED)
    return Verdict(OpState.FAILED, _why_interrupted(op))


def plan(records: Records, observed: Observed, mode: Pass,
         finalize: Finalize = by_steps) -> list[Action]:
    actions: list[Action] = []
    op = records.latest
    active_ids = set(records.active.values())
    candidates: set[int] = set()

    if op is not None and not op.terminal and records.latest_is_live:
        # Its owner is still running it: everything it started is its owner's.
        candidates.update(s.after_gen for s in op.steps if s.after_gen is not None)
    elif op is not None:
        interrupted = not op.terminal
        for step in steps_to_converge(op, interrupted):
            assert step.after_gen is not None
            published = step.after_gen in active_ids
            if not published:
                candidates.add(step.after_gen)  # removed here, not by the general pass
            error = None
            if interrupted and step.state is not StepState.SUCCEEDED:
                error = ("interrupted; the published generation is kept" if published
                         else "interrupted before publication; the candidate is removed")
            actions.append(Action(
                Kind.KEEP_CANDIDATE if published else Kind.REMOVE_CANDIDATE,
                generation=step.after_gen, op_id=op.id, seq=step.seq, reason=error,
                service=step.service,
            ))
            before = step.before_gen
            if before is not None and before != step.after_gen:
                for reason in sorted(records.inhibitions.get(before, frozenset())):
                    if reason is Inhibition.RETIREMENT_PENDING and published:
                        continue
                    actions.append(Action(Kind.CLEAR_INHIBITION, generation=before,
                                          reason=reason))
        # Its kind decides how it ends (the journal's step rule unless its spec says
        # otherwise; None: its kind's recovery carries it on at boot); the replicator
        # rules below finish the replicator's job.
        verdict = finalize(op) if interrupted else None
        if verdict is not None:
            ok = verdict.state is OpState.SUCCEEDED
            # The evidence step alone decides: it is journaled only by an attempt onto a
            # new release in hold mode (a deploy, a rollback, or a wake running a
            # release deferred to it), so its kind need not be asked.
            if (not ok and any(s.kind is StepKind.HOLD_EXEC for s in op.steps)
                    and not _hold_candidate_published(op, active_ids)):
                actions.append(Action(
                    Kind.MARK_DOWN, op_id=op.id,
                    reason="a hold-mode release was interrupted after it executed; it may "
                           "have migrated data, so the previous build is not restarted",
                ))
            actions.append(Action(Kind.FINALIZE, op_id=op.id, state=verdict.state,
                                  reason=verdict.reason))

    # An instance marked down by this very plan is treated as down already, so one
    # pass converges it (a second one must find nothing to do).
    running = records.instance.state is InstanceState.RUNNING and not any(
        a.kind is Kind.MARK_DOWN for a in actions)
    # The latest operation is still being run by its owner, who decides for now.
    owned = op is not None and not op.terminal and records.latest_is_live
    replicators = [g.id for g in records.live if g.service == REPLICA
                   and (g.id in observed.alive or g.id in observed.watched)]
    for gen in records.live:
        if gen.id in candidates or gen.id in records.owned:
            continue
        alive = gen.id in observed.alive or gen.id in observed.orphans
        if gen.service == REPLICA:
            if not alive:
                actions.append(Action(Kind.RECORD_GONE, generation=gen.id, service=REPLICA))
            elif owned:
                pass  # the operation running now syncs, stops or starts it
            elif gen.id not in observed.alive and gen.id not in observed.watched:
                # Its tree lives but its leader is dead or was never recorded (a crash
                # between spawn and record): it cannot be adopted, so it goes, and a
                # fresh one is started in its place.
                actions.append(Action(Kind.STOP_REPLICA, generation=gen.id, service=REPLICA,
                                      reason="its leader is not recorded"))
            elif not running or gen.id != max(replicators, default=gen.id):
                actions.append(Action(Kind.STOP_REPLICA, generation=gen.id, service=REPLICA,
                                      reason="a newer replicator runs" if running
                                      else f"its instance is {records.instance.state}"))
            elif mode is not Pass.MUTATION and gen.id not in observed.watched:
                actions.append(Action(Kind.ADOPT, generation=gen.id, service=REPLICA))
            continue
        if gen.id in active_ids:
            if not running and not owned and alive:
                actions.append(Action(Kind.STOP_ACTIVE, generation=gen.id, service=gen.service,
                                      reason=f"its instance is {records.instance.state}"))
            elif gen.id in observed.orphans and gen.id not in observed.alive:
                if gen.id not in observed.watched:
                    actions.append(Action(Kind.REMOVE_DESCENDANTS, generation=gen.id,
                                          service=gen.service, reason="its leader exited"))
            elif not alive:
                actions.append(Action(Kind.RECORD_GONE, generation=gen.id, service=gen.service))
            elif mode is not Pass.MUTATION and gen.id not in observed.watched:
                actions.append(Action(Kind.ADOPT, generation=gen.id, service=gen.service))
            continue
        if not alive:
            actions.append(Action(Kind.RECORD_GONE, generation=gen.id, service=gen.service))
            continue
        reasons = records.inhibitions.get(gen.id, frozenset())
        if Inhibition.RETIREMENT_PENDING in reasons:
            successor = records.active.get(gen.service)
            verified = successor is not None and successor in observed.alive
            routed = gen.service != "web" or records.routed.get(
                records.instance.host) == successor
            if mode is not Pass.MUTATION and verified and routed:
                actions.append(Action(Kind.RETIRE, generation=gen.id, service=gen.service))
            continue
        if mode is Pass.MUTATION and gen.id in observed.watched:
            # A generation this control plane is running that no record of the latest
            # operation names: another task owns it (a crash restart in flight).
            continue
        actions.append(Action(Kind.REMOVE_STRAY, generation=gen.id, service=gen.service))

    if mode is not Pass.MUTATION and running:
        live_ids = {g.id for g in records.live}
        for service, gen_id in sorted(records.active.items()):
            # Restarted once its leader is dead; a watcher still removing the tree of a
            # leader that just died restarts it itself (the crash path, with backoff).
            alive = gen_id in live_ids and gen_id in observed.alive
            if records.fenced:
                break  # nothing starts a fenced instance (SPEC §1 fence)
            if not alive and not (gen_id in live_ids and gen_id in observed.watched):
                actions.append(Action(Kind.RESTART_ACTIVE, generation=gen_id, service=service))
        # The recovery path: a route left holding or pointing elsewhere by an interrupted
        # operation goes back to the ACTIVE web once that web is alive (it was verified
        # ready when it became ACTIVE). A dead one is restarted first, which publishes.
        web = records.active.get("web")
        host = records.instance.host
        # A frozen route stays frozen (keelway/deploy/freezing.py): its processes may be
        # stopped in place, and only a wake, which thaws them first, serves it again.
        if (web is not None and web in live_ids and web in observed.alive
                and not owned and records.route_state is not RouteState.FROZEN
                and (records.route_state is not RouteState.SERVING
                     or records.routed.get(host) != web)):
            actions.append(Action(Kind.RESTORE_ROUTE, generation=web, service="web"))
        if (records.replicate and not records.fenced and not owned and not replicators
                and web is not None and web in live_ids and web in observed.alive):
            actions.append(Action(Kind.START_REPLICA, service=REPLICA))
        actions.append(Action(Kind.REPUBLISH))
    return actions


def _why_interrupted(op: Operation) -> str:
    faults = [s.error for s in op.steps if s.kind is StepKind.FAULT and s.error]
    return faults[-1] if faults else "interrupted by a control-plane crash"


def _hold_candidate_published(op: Operation, active_ids: set[int]) -> bool:
    return any(s.after_gen in active_ids for s in op.steps if s.after_gen is not None)


def leftovers(op: Operation | None, active_ids: set[int], latest_is_live: bool) -> list[Step]:
    """Steps whose candidate is still unconverged and unpublished: what fails closed."""
    if op is None or (not op.terminal and latest_is_live):
        return []
    return [s for s in steps_to_converge(op, not op.terminal) if s.after_gen not in active_ids]
