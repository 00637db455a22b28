"""The reconciler's decisions, from records alone (no processes, no I/O)."""

from __future__ import annotations

from keelway.journal import Inhibition, OpKind, StepKind
from keelway.reconcile.plan import (
    Kind,
    Observed,
    Records,
    leftovers,
    plan,
)
from keelway.reconcile.plan import Pass as Mode
from keelway.store.lifecycle import GenState, InstanceState, OpState, RouteState, StepState
from keelway.store.records import Generation, Instance, Operation, Step

HOST = "one.test"


def inst(state: InstanceState = InstanceState.RUNNING) -> Instance:
    return Instance(HOST, "hello", state, 0, 1, 0.0, 1)


def gen(gen_id: int, service: str = "web", state: GenState = GenState.READY) -> Generation:
    return Generation(gen_id, "hello", HOST, service, 1, "d" * 64, 1, state,
                      0.0, None, None, 1)


def step(seq: int, kind: StepKind, *, after: int | None = None, before: int | None = None,
         state: StepState = StepState.SUCCEEDED, converged: bool = False) -> Step:
    return Step(7, seq, kind, "web", before, after, state, None, None, 0.0, None, converged)


def op(steps: list[Step], state: OpState = OpState.RUNNING,
       kind: OpKind = OpKind.DEPLOY) -> Operation:
    return Operation(7, "hello", HOST, kind, None, None, state, None, [], "old", 0.0, None, 1,
                     steps)


def observed(*alive: int, watched: tuple[int, ...] = ()) -> Observed:
    return Observed(frozenset(alive), frozenset(watched))


def kinds(actions: list) -> list[tuple[Kind, int | None]]:  # type: ignore[type-arg]
    return [(a.kind, a.generation) for a in actions if a.kind is not Kind.REPUBLISH]


def test_a_succeeded_latest_operation_with_everything_alive_plans_nothing() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2)], OpState.SUCCEEDED),
                      False, {"web": 2}, [gen(2)])
    assert kinds(plan(records, observed(2, watched=(2,)), Mode.MUTATION)) == []


def test_an_interrupted_candidate_that_active_names_is_kept_and_the_op_succeeds() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2, before=1)]), False,
                      {"web": 2}, [gen(1), gen(2)],
                      inhibitions={1: frozenset({Inhibition.RETIREMENT_PENDING})}, routed={HOST: 2})
    actions = plan(records, observed(1, 2, watched=(1, 2)), Mode.BOOT)
    assert (Kind.KEEP_CANDIDATE, 2) in kinds(actions)
    finalize = next(a for a in actions if a.kind is Kind.FINALIZE)
    assert finalize.state is OpState.SUCCEEDED
    # The old generation still serves until the successor is verified and routed.
    assert (Kind.RETIRE, 1) in kinds(actions)
    assert (Kind.CLEAR_INHIBITION, 1) not in kinds(actions)


def test_an_interrupted_unpublished_candidate_is_removed_and_the_op_fails() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2, before=1,
                                       state=StepState.PENDING)]), False,
                      {"web": 1}, [gen(1), gen(2)],
                      inhibitions={1: frozenset({Inhibition.REPLACEMENT_PENDING})})
    actions = plan(records, observed(1, 2, watched=(1,)), Mode.MUTATION)
    assert kinds(actions)[:2] == [(Kind.REMOVE_CANDIDATE, 2), (Kind.CLEAR_INHIBITION, 1)]
    finalize = next(a for a in actions if a.kind is Kind.FINALIZE)
    assert finalize.state is OpState.FAILED
    # A mutation pass never restarts or republishes: only boot and periodic do.
    assert not any(a.kind in (Kind.RESTART_ACTIVE, Kind.REPUBLISH) for a in actions)


def test_an_operation_owned_by_a_live_task_is_left_to_its_owner() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2, state=StepState.PENDING)]),
                      True, {"web": 1}, [gen(1), gen(2)])
    actions = plan(records, observed(1, 2, watched=(1, 2)), Mode.PERIODIC)
    assert not any(a.kind in (Kind.REMOVE_CANDIDATE, Kind.FINALIZE, Kind.REMOVE_STRAY)
                   for a in actions)


def test_a_converged_step_is_never_looked_at_again() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2, converged=True)],
                                 OpState.FAILED), False, {"web": 1}, [gen(1)])
    assert kinds(plan(records, observed(1, watched=(1,)), Mode.MUTATION)) == []


def test_an_interrupted_hold_release_that_executed_marks_the_instance_down() -> None:
    records = Records(inst(), op([step(1, StepKind.STOP, before=1),
                                  step(2, StepKind.HOLD_EXEC),
                                  step(3, StepKind.SPAWN, after=2, state=StepState.PENDING)]),
                      False, {"worker": 1}, [gen(2, "worker")])
    actions = plan(records, observed(2), Mode.BOOT)
    assert any(a.kind is Kind.MARK_DOWN for a in actions)
    assert not any(a.kind is Kind.RESTART_ACTIVE for a in actions)


def test_an_operation_that_raised_converges_as_interrupted_and_says_its_own_error() -> None:
    fault = Step(7, 4, StepKind.FAULT, None, None, None, StepState.FAILED,
                 "publish: ValueError: boom", None, 0.0, None, False)
    records = Records(inst(), op([step(1, StepKind.STOP, before=1),
                                  step(2, StepKind.HOLD_EXEC),
                                  step(3, StepKind.SPAWN, after=2), fault]),
                      False, {"worker": 1}, [gen(2, "worker")])
    actions = plan(records, observed(2), Mode.MUTATION)
    # The same convergence as after a crash: the unpublished candidate goes, and a hold
    # release that executed keeps the instance down...
    assert (Kind.REMOVE_CANDIDATE, 2) in kinds(actions)
    assert any(a.kind is Kind.MARK_DOWN for a in actions)
    # ...but the outcome is the error the operation recorded, not a crash.
    finalize = next(a for a in actions if a.kind is Kind.FINALIZE)
    assert finalize.state is OpState.FAILED and finalize.reason == "publish: ValueError: boom"


def test_an_interrupted_restart_in_hold_mode_rebuilds_from_active() -> None:
    records = Records(inst(), op([step(1, StepKind.STOP, before=1),
                                  step(2, StepKind.SPAWN, after=2, state=StepState.PENDING)],
                                 kind=OpKind.RESTART), False, {"worker": 1}, [gen(2, "worker")])
    actions = plan(records, observed(2), Mode.BOOT)
    assert not any(a.kind is Kind.MARK_DOWN for a in actions)
    assert (Kind.RESTART_ACTIVE, 1) in kinds(actions)


def test_a_dead_active_generation_is_recorded_gone_and_restarted_at_boot_only() -> None:
    records = Records(inst(), None, False, {"web": 1}, [gen(1)])
    assert kinds(plan(records, observed(), Mode.MUTATION)) == [(Kind.RECORD_GONE, 1)]
    assert kinds(plan(records, observed(), Mode.BOOT)) == [(Kind.RECORD_GONE, 1),
                                                           (Kind.RESTART_ACTIVE, 1)]


def test_a_stopped_instance_is_not_restarted() -> None:
    records = Records(inst(InstanceState.STOPPED), None, False, {"web": 1}, [])
    assert kinds(plan(records, observed(), Mode.BOOT)) == []


def test_a_live_stray_is_removed_and_a_survivor_is_adopted_at_boot() -> None:
    records = Records(inst(), None, False, {"web": 1}, [gen(1), gen(5)], routed={HOST: 1},
                      route_state=RouteState.SERVING)
    assert kinds(plan(records, observed(1, 5), Mode.BOOT)) == [(Kind.ADOPT, 1),
                                                               (Kind.REMOVE_STRAY, 5)]


def test_a_spawned_but_unrecorded_candidate_is_found_as_an_orphan_and_removed() -> None:
    planned = gen(2, state=GenState.PLANNED)
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2, state=StepState.PENDING)]),
                      False, {"web": 1}, [gen(1), planned])
    seen = Observed(frozenset({1}), frozenset({1}), orphans=frozenset({2}))
    assert (Kind.REMOVE_CANDIDATE, 2) in kinds(plan(records, seen, Mode.BOOT))


def test_planning_twice_after_applying_plans_nothing_more() -> None:
    # What apply leaves behind: the step converged, the op finalized, the stray gone.
    after = Records(inst(), op([step(1, StepKind.SPAWN, after=2, state=StepState.FAILED,
                                     converged=True)], OpState.FAILED),
                    False, {"web": 1}, [gen(1)], routed={HOST: 1},
                    route_state=RouteState.SERVING)
    assert kinds(plan(after, observed(1, watched=(1,)), Mode.BOOT)) == []


def test_leftovers_name_unconverged_unpublished_candidates_of_a_dead_operation() -> None:
    dead = op([step(1, StepKind.SPAWN, after=2, state=StepState.PENDING)])
    assert [s.after_gen for s in leftovers(dead, {1}, False)] == [2]
    assert leftovers(dead, {1}, True) == []
    assert leftovers(dead, {2}, False) == []


def test_a_route_left_holding_by_a_crash_goes_back_to_the_active_web_on_recovery() -> None:
    records = Records(inst(), op([step(1, StepKind.WITHDRAW)], OpState.FAILED), False,
                      {"web": 1}, [gen(1)], routed={HOST: 1}, route_state=RouteState.HOLDING)
    assert (Kind.RESTORE_ROUTE, 1) in kinds(plan(records, observed(1, watched=(1,)),
                                                 Mode.BOOT))
    assert kinds(plan(records, observed(1, watched=(1,)), Mode.MUTATION)) == []


def test_an_active_generation_whose_leader_died_with_descendants_alive_is_not_gone() -> None:
    # Its leader is dead (not in `alive`) but its tree has a member (a daemonized child):
    # the descendants are removed first, never recorded gone; then the web is restarted.
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2)], OpState.SUCCEEDED),
                      False, {"web": 2}, [gen(2)], routed={HOST: 2},
                      route_state=RouteState.SERVING)
    seen = Observed(frozenset(), frozenset(), orphans=frozenset({2}))
    actions = kinds(plan(records, seen, Mode.BOOT))
    assert actions == [(Kind.REMOVE_DESCENDANTS, 2), (Kind.RESTART_ACTIVE, 2)]
    assert (Kind.RECORD_GONE, 2) not in kinds(plan(records, seen, Mode.MUTATION))


def test_a_tree_its_own_watcher_is_removing_is_left_to_the_watcher() -> None:
    records = Records(inst(), op([step(1, StepKind.SPAWN, after=2)], OpState.SUCCEEDED),
                      False, {"web": 2}, [gen(2)], routed={HOST: 2},
                      route_state=RouteState.SERVING)
    seen = Observed(frozenset(), frozenset({2}), orphans=frozenset({2}))
    assert kinds(plan(records, seen, Mode.PERIODIC)) == []


def test_an_interrupted_stop_stops_what_active_still_runs_and_keeps_active() -> None:
    # The stop's out-of-service write landed, the crash came before its stop steps.
    interrupted = op([step(1, StepKind.OUT_OF_SERVICE)], kind=OpKind.STOP)
    records = Records(inst(InstanceState.STOPPED), interrupted, False, {"web": 1, "worker": 2},
                      [gen(1), gen(2, "worker")], route_state=RouteState.GATED)
    actions = plan(records, observed(1, 2), Mode.BOOT)
    assert kinds(actions) == [(Kind.FINALIZE, None), (Kind.STOP_ACTIVE, 1),
                              (Kind.STOP_ACTIVE, 2)]
    # Nothing restarts it and nothing routes to it: it stays stopped.
    assert not any(a.kind in (Kind.RESTART_ACTIVE, Kind.RESTORE_ROUTE) for a in actions)


def test_an_out_of_service_instance_is_left_to_a_live_owner_only() -> None:
    running_stop = op([step(1, StepKind.OUT_OF_SERVICE)], kind=OpKind.STOP)
    owned = Records(inst(InstanceState.STOPPED), running_stop, True, {"web": 1}, [gen(1)])
    assert kinds(plan(owned, observed(1, watched=(1,)), Mode.PERIODIC)) == []
    done = Records(inst(InstanceState.DOWN), None, False, {"web": 1}, [gen(1)])
    for mode in Mode:
        assert kinds(plan(done, observed(1), mode)) == [(Kind.STOP_ACTIVE, 1)]


def test_an_interrupted_start_that_wrote_running_restarts_active_at_boot() -> None:
    interrupted = op([step(1, StepKind.IN_SERVICE)], kind=OpKind.START)
    records = Records(inst(), interrupted, False, {"web": 1}, [gen(1, state=GenState.GONE)])
    assert (Kind.RESTART_ACTIVE, 1) in kinds(plan(records, observed(), Mode.BOOT))
