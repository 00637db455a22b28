"""The plans of `instances add`, `instances remove` (keelway/deploy/instances.py) and
`apps destroy` (keelway/deploy/apps.py), daemon-less on the `records` fixture."""

from __future__ import annotations

from keelway.deploy.apps import APP_SCOPE, AppRequest, plan_destroy, plan_forget_app
from keelway.deploy.instances import (
    AddRequest,
    Purges,
    RemoveRequest,
    plan_add,
    plan_remove,
    starts_after_add,
)
from keelway.deploy.operation import Plan
from keelway.journal import StepKind
from keelway.store.lifecycle import Removal
from tests.deploy.conftest import DIGEST, Records

ONE, TWO = "one.shop.test", "two.shop.test"
BOTH = Purges(replica=True, snapshots=True)


def _kinds(plan: Plan) -> tuple[StepKind, ...]:
    return tuple(step.kind for step in plan.steps)


def _released(records: Records) -> None:
    for host in (ONE, TWO):
        records.instance(host)
    records.store.builds.record_build("shop", DIGEST, "/builds/shop")
    records.store.builds.create_release("shop", DIGEST, {}, "first")


def test_added_instances_are_laid_down_in_one_step_and_then_each_started_on_the_release(
        records: Records) -> None:
    _released(records)
    request = AddRequest("a.shop.test", "shop", ("a.shop.test", "b.shop.test"))
    plan = plan_add(records.store, request)
    assert _kinds(plan) == (StepKind.LAY_DOWN,)
    assert plan.steps[0].before == ("laydown.before",) and plan.host == "a.shop.test"
    assert starts_after_add(records.store, request) == [
        "start a.shop.test on v1 (an attempt of its own)",
        "start b.shop.test on v1 (an attempt of its own)"]


def test_instances_added_parked_or_to_an_app_with_no_release_start_nothing(
        records: Records) -> None:
    _released(records)
    parked = AddRequest("a.shop.test", "shop", ("a.shop.test",), parked=True)
    assert starts_after_add(records.store, parked) == []
    records.store.apps.create_app("empty")
    assert starts_after_add(records.store, AddRequest("a.test", "empty", ("a.test",))) == []


def test_a_removal_withdraws_stops_every_live_generation_then_forgets(
        records: Records) -> None:
    _released(records)
    web = records.running(ONE, "web")
    worker = records.running(ONE, "worker", pid=4243)
    plan = plan_remove(records.store, RemoveRequest(ONE, Removal.KEEP_DATA, BOTH))
    assert _kinds(plan) == (StepKind.WITHDRAW, StepKind.STOP, StepKind.STOP, StepKind.FORGET)
    assert [s.before_gen for s in plan.steps[1:3]] == [web.id, worker.id]
    assert plan.steps[1].before == ("remove.stop.before",)


def test_a_purging_removal_deletes_the_data_then_the_replica_then_the_snapshots(
        records: Records) -> None:
    _released(records)
    plan = plan_remove(records.store, RemoveRequest(ONE, Removal.PURGE_DATA, BOTH))
    assert _kinds(plan) == (StepKind.WITHDRAW, StepKind.PURGE_DATA, StepKind.PURGE_REPLICA,
                            StepKind.PURGE_SNAPSHOTS, StepKind.FORGET)
    bare = plan_remove(records.store, RemoveRequest(ONE, Removal.PURGE_DATA,
                                                    Purges(replica=False, snapshots=False)))
    assert _kinds(bare) == (StepKind.WITHDRAW, StepKind.PURGE_DATA, StepKind.FORGET)


def test_a_destroy_removes_each_instance_then_forgets_the_app_in_its_own_operation(
        records: Records) -> None:
    _released(records)
    plans = plan_destroy(records.store, "shop", lambda host: plan_remove(
        records.store, RemoveRequest(host, Removal.KEEP_DATA, BOTH)))
    assert [scope for scope, _ in plans] == [ONE, TWO, APP_SCOPE]
    assert _kinds(plans[0][1]) == (StepKind.WITHDRAW, StepKind.FORGET)
    app = plan_forget_app(records.store, AppRequest(APP_SCOPE, "shop"))
    assert _kinds(app) == (StepKind.REMOVE_BUILDS, StepKind.FORGET) == _kinds(plans[-1][1])
    assert app.steps[0].before == ("destroy.builds.before",) and app.host == APP_SCOPE
