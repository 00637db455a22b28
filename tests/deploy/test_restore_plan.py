"""The plan of `db restore` (keelway/deploy/restore.py plan_restore), daemon-less."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.deploy.restore import RestoreRequest, plan_restore
from keelway.journal import StepKind
from keelway.store import Store
from keelway.store.lifecycle import InstanceState
from tests.deploy import records as made

HOST = "one.shop.test"


@pytest.fixture
def records(tmp_path: Path) -> Store:
    store = made.fresh(tmp_path)
    made.released(store, "shop", [HOST])
    return store


def test_a_running_instances_restore_holds_stops_all_swaps_then_starts_active_again(
        records: Store) -> None:
    web, worker = made.running(records, "shop", HOST, ["web", "worker"])
    plan = plan_restore(records, RestoreRequest(HOST, replicating=False))
    assert plan.kinds() == (StepKind.HOLD_ROUTE, StepKind.STOP, StepKind.STOP,
                            StepKind.SWAP_DB, StepKind.SPAWN, StepKind.SPAWN)
    assert [s.before_gen for s in plan.steps if s.kind is StepKind.STOP] == [web.id, worker.id]
    assert [s.delegated for s in plan.steps] == [False] * 4 + [True] * 2
    assert plan.steps[0].before == ("restore.hold.before",)
    assert plan.steps[3].after == ("restore.swap.after",)


def test_a_parked_instances_restore_swaps_its_file_and_holds_stops_and_starts_nothing(
        records: Store) -> None:
    inst = records.get_instance(HOST)
    assert inst is not None
    records.set_instance_state(inst, InstanceState.PARKED)
    assert plan_restore(records, RestoreRequest(HOST, replicating=False)).kinds() == (
        StepKind.SWAP_DB,)


def test_a_replicating_box_sets_the_replica_aside_before_the_swap_and_begins_one_after(
        records: Store) -> None:
    made.running(records, "shop", HOST, ["web"])
    plan = plan_restore(records, RestoreRequest(HOST, replicating=True))
    assert plan.kinds() == (StepKind.HOLD_ROUTE, StepKind.STOP, StepKind.REPLICA_RESET,
                            StepKind.SWAP_DB, StepKind.REPLICA_STOP, StepKind.SPAWN)
    assert plan.steps[2].before == ("restore.replica.before",)


def test_the_restore_of_a_host_that_names_no_instance_plans_nothing(records: Store) -> None:
    plan = plan_restore(records, RestoreRequest("none.shop.test", replicating=True))
    assert plan.steps == () and plan.refused == "no instance none.shop.test"


def test_a_restores_dry_run_is_one_line_per_step(records: Store) -> None:
    made.running(records, "shop", HOST, ["web"])
    plan = plan_restore(records, RestoreRequest(HOST, replicating=False))
    assert len(plan.lines()) == len(plan.steps) == 4
    assert plan.lines()[0] == f"hold {HOST}'s route (requests wait) and publish it"
