"""The reconciler's rules for an instance's replicator, from records alone."""

from __future__ import annotations

from keelway.journal import REPLICA, OpKind, StepKind
from keelway.reconcile.plan import Kind, Observed, Records, plan
from keelway.reconcile.plan import Pass as Mode
from keelway.store.lifecycle import InstanceState, OpState, RouteState, StepState
from keelway.store.records import Operation
from tests.reconcile.test_plan import HOST, gen, inst, kinds, observed, op, step

DONE = op([step(1, StepKind.SPAWN, after=2)], OpState.SUCCEEDED)


def records(state: InstanceState = InstanceState.RUNNING, *extra: int,
            replicate: bool = True, fenced: bool = False) -> Records:
    return Records(inst(state), DONE, False, {"web": 2},
                   [gen(2), *(gen(g, REPLICA) for g in extra)], routed={HOST: 2},
                   route_state=RouteState.SERVING, fenced=fenced, replicate=replicate)


def test_a_running_instance_with_its_replicator_alive_plans_nothing() -> None:
    assert kinds(plan(records(InstanceState.RUNNING, 3), observed(2, 3, watched=(2, 3)),
                      Mode.PERIODIC)) == []


def test_the_replicator_is_no_stray_and_is_adopted_after_a_restart() -> None:
    assert kinds(plan(records(InstanceState.RUNNING, 3), observed(2, 3), Mode.BOOT)) == [
        (Kind.ADOPT, 2), (Kind.ADOPT, 3)]


def test_a_running_instance_without_a_replicator_gets_one_but_not_in_a_mutation() -> None:
    assert (Kind.START_REPLICA, None) in kinds(plan(records(), observed(2), Mode.PERIODIC))
    assert kinds(plan(records(), observed(2, watched=(2,)), Mode.MUTATION)) == []


def test_a_dead_replicator_is_recorded_gone_and_replaced() -> None:
    planned = kinds(plan(records(InstanceState.RUNNING, 3), observed(2, watched=(2,)),
                         Mode.PERIODIC))
    assert planned == [(Kind.RECORD_GONE, 3), (Kind.START_REPLICA, None)]


def test_a_parked_instances_replicator_is_stopped_and_none_is_started() -> None:
    planned = kinds(plan(records(InstanceState.PARKED, 3), observed(3), Mode.PERIODIC))
    assert planned == [(Kind.RECORD_GONE, 2), (Kind.STOP_REPLICA, 3)]  # its web is gone


def test_of_two_replicators_the_older_is_stopped() -> None:
    planned = kinds(plan(records(InstanceState.RUNNING, 3, 4),
                         observed(2, 3, 4, watched=(2, 3, 4)), Mode.PERIODIC))
    assert planned == [(Kind.STOP_REPLICA, 3)]


def test_no_replicator_starts_when_fenced_or_when_replication_is_off() -> None:
    assert kinds(plan(records(fenced=True), observed(2, watched=(2,)), Mode.PERIODIC)) == []
    assert kinds(plan(records(replicate=False), observed(2, watched=(2,)),
                      Mode.PERIODIC)) == []


def test_a_replicator_whose_pid_a_crash_kept_from_the_record_is_stopped_and_replaced() -> None:
    seen = Observed(frozenset({2}), frozenset({2}), orphans=frozenset({3}))
    planned = kinds(plan(records(InstanceState.RUNNING, 3), seen, Mode.BOOT))
    assert planned == [(Kind.STOP_REPLICA, 3), (Kind.START_REPLICA, None)]


def _finalized(latest: Operation) -> OpState | None:
    records = Records(inst(), latest, False, {"web": 2}, [gen(2)], routed={HOST: 2},
                      route_state=RouteState.SERVING, replicate=True)
    return next(a.state for a in plan(records, observed(2), Mode.BOOT)
                if a.kind is Kind.FINALIZE)


def test_a_crash_in_the_replicator_step_after_a_published_deploy_does_not_fail_it() -> None:
    # The deploy's web is published (ACTIVE); the hook's replicator start was pending.
    deploy = op([step(1, StepKind.SPAWN, after=2, converged=True),
                 step(2, StepKind.PUBLISH),
                 step(3, StepKind.REPLICA_START, state=StepState.PENDING)])
    assert _finalized(deploy) is OpState.SUCCEEDED
    park = op([step(1, StepKind.PARK), step(2, StepKind.REPLICA_STOP, state=StepState.FAILED)],
              kind=OpKind.PARK)
    assert _finalized(park) is OpState.SUCCEEDED


def test_a_crash_in_the_replicator_step_of_a_replicate_operation_fails_it() -> None:
    replicate = op([step(1, StepKind.REPLICA_START, state=StepState.PENDING)],
                   kind=OpKind.REPLICATE)
    assert _finalized(replicate) is OpState.FAILED
    # ...and a deploy's own pending step still fails it, replicator or not.
    deploy = op([step(1, StepKind.PUBLISH, state=StepState.PENDING)])
    assert _finalized(deploy) is OpState.FAILED
