"""The reconciler's rules for parked and fenced instances, from records alone."""

from __future__ import annotations

from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Kind, Records, plan
from keelway.reconcile.plan import Pass as Mode
from keelway.store.lifecycle import InstanceState, OpState, RouteState, StepState
from tests.reconcile.test_plan import gen, inst, kinds, observed, op, step


def parked(latest_state: OpState = OpState.RUNNING, live: bool = False) -> Records:
    latest = op([step(1, StepKind.PARK), step(2, StepKind.STOP, before=2,
                                              state=StepState.PENDING)],
                latest_state, kind=OpKind.PARK)
    return Records(inst(InstanceState.PARKED), latest, live, {"web": 2, "worker": 3},
                   [gen(2), gen(3, "worker")], route_state=RouteState.PARKED)


def test_a_park_interrupted_before_its_stops_has_every_active_generation_stopped() -> None:
    for mode in Mode:
        actions = kinds(plan(parked(), observed(2, 3), mode))
        assert (Kind.STOP_ACTIVE, 2) in actions and (Kind.STOP_ACTIVE, 3) in actions
        assert not any(k is Kind.RESTART_ACTIVE for k, _ in actions)


def test_a_parked_instance_whose_processes_are_gone_restarts_nothing() -> None:
    actions = kinds(plan(parked(OpState.SUCCEEDED), observed(), Mode.BOOT))
    assert all(k is Kind.RECORD_GONE for k, _ in actions), actions


def test_a_park_still_running_here_is_left_to_its_owner() -> None:
    actions = kinds(plan(parked(live=True), observed(2, 3, watched=(2, 3)), Mode.PERIODIC))
    assert not any(k is Kind.STOP_ACTIVE for k, _ in actions)


def test_a_fenced_instance_with_its_active_dead_is_not_restarted() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2)], OpState.SUCCEEDED),
                      False, {"web": 2}, [gen(2)], fenced=True)
    actions = kinds(plan(records, observed(), Mode.BOOT))
    assert (Kind.RECORD_GONE, 2) in actions
    assert not any(k is Kind.RESTART_ACTIVE for k, _ in actions)


def test_an_unfenced_instance_with_its_active_dead_is_restarted() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2)], OpState.SUCCEEDED),
                      False, {"web": 2}, [gen(2)])
    assert (Kind.RESTART_ACTIVE, 2) in kinds(plan(records, observed(), Mode.BOOT))
