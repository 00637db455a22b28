"""The plan of `db restore` (keelway/deploy/restore.py plan_restore), daemon-less, on
the `records` fixture."""

from __future__ import annotations

import pytest

from keelway.deploy.operation import Plan
from keelway.deploy.restore import ImportInEffect, RestoreRequest, plan_restore
from keelway.journal import StepKind
from keelway.store.lifecycle import InstanceState
from tests.deploy.conftest import Records

HOST = "one.shop.test"


def _kinds(plan: Plan) -> tuple[StepKind, ...]:
    return tuple(step.kind for step in plan.steps)


def test_a_running_instances_restore_holds_stops_all_swaps_then_starts_active_again(
        records: Records) -> None:
    records.instance(HOST)
    web = records.running(HOST, "web")
    worker = records.running(HOST, "worker", pid=4243)
    plan = plan_restore(records.store, RestoreRequest(HOST, replicating=False))
    assert _kinds(plan) == (StepKind.HOLD_ROUTE, StepKind.STOP, StepKind.STOP,
                            StepKind.SWAP_DB, StepKind.SPAWN)
    assert [s.before_gen for s in plan.steps if s.kind is StepKind.STOP] == [web.id, worker.id]
    assert [s.journals_own for s in plan.steps] == [False] * 4 + [True]
    assert plan.steps[0].before == ("restore.hold.before",)
    assert plan.steps[3].after == ("restore.swap.after",)


def test_a_parked_instances_restore_swaps_its_file_and_holds_stops_and_starts_nothing(
        records: Records) -> None:
    records.instance(HOST, state=InstanceState.PARKED)
    plan = plan_restore(records.store, RestoreRequest(HOST, replicating=False))
    assert _kinds(plan) == (StepKind.SWAP_DB,)


def test_a_replicating_box_sets_the_replica_aside_before_the_swap_and_begins_one_after(
        records: Records) -> None:
    records.instance(HOST)
    records.running(HOST, "web")
    plan = plan_restore(records.store, RestoreRequest(HOST, replicating=True))
    assert _kinds(plan) == (StepKind.HOLD_ROUTE, StepKind.STOP, StepKind.REPLICA_RESET,
                            StepKind.SWAP_DB, StepKind.REPLICA_STOP, StepKind.SPAWN)
    assert plan.steps[2].before == ("restore.replica.before",)


def test_a_restore_is_refused_while_a_seed_import_is_journaled(records: Records) -> None:
    records.instance(HOST)
    records.store.imports.begin_import(HOST, "seed-00000000000000aa", env_before={},
                                       sha256="0" * 64)
    with pytest.raises(ImportInEffect):
        plan_restore(records.store, RestoreRequest(HOST, replicating=False))


def test_a_restores_dry_run_is_one_line_per_step(records: Records) -> None:
    records.instance(HOST)
    records.running(HOST, "web")
    plan = plan_restore(records.store, RestoreRequest(HOST, replicating=False))
    assert len(plan.lines()) == 1 + len(plan.steps) == 5
    assert plan.lines()[1].endswith(f"hold {HOST}'s route (requests wait) and publish it")
