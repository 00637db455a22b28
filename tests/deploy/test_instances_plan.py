"""The plans of `instances add`, `instances remove` (keelway/deploy/instances.py) and
`apps destroy` (keelway/deploy/apps.py), daemon-less."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.deploy.apps import APP_SCOPE, plan_destroy
from keelway.deploy.instances import AddRequest, Purges, RemoveRequest, plan_add, plan_remove
from keelway.journal import StepKind
from keelway.store import Store
from keelway.store.lifecycle import Removal
from tests.deploy import records as made

ONE, TWO = "one.shop.test", "two.shop.test"


@pytest.fixture
def records(tmp_path: Path) -> Store:
    store = made.fresh(tmp_path)
    made.released(store, "shop", [ONE, TWO])
    return store


def test_added_instances_are_laid_down_in_one_step_then_each_started_on_the_release(
        records: Store) -> None:
    plan = plan_add(records, AddRequest("shop", ("a.shop.test", "b.shop.test")))
    assert plan.kinds() == (StepKind.LAY_DOWN, StepKind.SPAWN, StepKind.SPAWN)
    assert plan.steps[0].before == ("laydown.before",) and plan.steps[0].detail == (
        "2 instances")
    assert [s.delegated for s in plan.steps] == [False, True, True]
    assert plan.lines()[1] == "start a.shop.test on v1 (an attempt of its own)"


def test_instances_added_parked_or_to_an_app_with_no_release_start_nothing(
        records: Store) -> None:
    assert plan_add(records, AddRequest("shop", ("a.shop.test",), parked=True)).kinds() == (
        StepKind.LAY_DOWN,)
    records.create_app("empty")
    assert plan_add(records, AddRequest("empty", ("a.shop.test",))).kinds() == (
        StepKind.LAY_DOWN,)


def test_a_removal_withdraws_stops_every_live_generation_then_forgets(
        records: Store) -> None:
    web, worker = made.running(records, "shop", ONE, ["web", "worker"])
    plan = plan_remove(records, RemoveRequest(ONE, Removal.KEEP_DATA, Purges(replica=True,
                                                                         snapshots=True)))
    assert plan.kinds() == (StepKind.WITHDRAW, StepKind.STOP, StepKind.STOP, StepKind.FORGET)
    assert [s.before_gen for s in plan.steps[1:3]] == [web.id, worker.id]
    assert plan.steps[1].before == ("remove.stop.before",)
    assert plan.steps[-1].detail == f"instance {ONE}"


def test_a_purging_removal_deletes_the_data_then_the_replica_then_the_snapshots(
        records: Store) -> None:
    plan = plan_remove(records, RemoveRequest(ONE, Removal.PURGE_DATA, Purges(replica=True,
                                                                         snapshots=True)))
    assert plan.kinds() == (StepKind.WITHDRAW, StepKind.PURGE_DATA, StepKind.PURGE_REPLICA,
                            StepKind.PURGE_SNAPSHOTS, StepKind.FORGET)
    bare = plan_remove(records, RemoveRequest(ONE, Removal.PURGE_DATA, Purges(replica=False,
                                                                          snapshots=False)))
    assert bare.kinds() == (StepKind.WITHDRAW, StepKind.PURGE_DATA, StepKind.FORGET)


def test_a_destroy_removes_each_instance_then_forgets_the_app_in_its_own_operation(
        records: Store) -> None:
    plans = plan_destroy(records, "shop", lambda host: plan_remove(records, RemoveRequest(
        host, Removal.KEEP_DATA, Purges(replica=False, snapshots=False))))
    assert [scope for scope, _ in plans] == [ONE, TWO, APP_SCOPE]
    assert plans[0][1].kinds() == (StepKind.WITHDRAW, StepKind.FORGET)
    assert plans[-1][1].kinds() == (StepKind.REMOVE_BUILDS, StepKind.FORGET)
    assert plans[-1][1].steps[0].before == ("destroy.builds.before",)
