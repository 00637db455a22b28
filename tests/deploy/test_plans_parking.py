"""Park's plan, from records alone: what the runner would journal, and its dry-run."""

from __future__ import annotations

import pytest

from keelway.deploy.errors import UserError
from keelway.deploy.parking import PARK, ParkRequest, plan_park
from keelway.journal import OpKind, StepKind
from keelway.store.lifecycle import InstanceState
from tests.deploy.conftest import Records


def test_a_park_plans_the_intent_then_the_publish_then_a_stop_of_each_generation(
        records: Records) -> None:
    records.instance("a.test")
    web = records.running("a.test", "web")
    worker = records.running("a.test", "worker")
    plan = plan_park(records.store, ParkRequest("a.test"))
    assert plan.kind is OpKind.PARK and plan.app == "shop" and plan.nothing is None
    assert [s.kind for s in plan.steps] == [StepKind.PARK, StepKind.PUBLISH, StepKind.STOP,
                                            StepKind.STOP]
    assert [s.before_gen for s in plan.steps[2:]] == [web.id, worker.id]
    assert plan.steps[0].before == ("park.before",) and plan.steps[0].after == ("park.after",)


def test_a_park_leaves_the_replicator_to_the_replication_hook(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.running("a.test", "replica", active=False)
    plan = plan_park(records.store, ParkRequest("a.test"))
    assert [s.service for s in plan.steps if s.kind is StepKind.STOP] == ["web"]


def test_a_parked_instance_plans_nothing(records: Records) -> None:
    records.instance("a.test", state=InstanceState.PARKED)
    plan = plan_park(records.store, ParkRequest("a.test"))
    assert plan.steps == () and plan.nothing == "parked already"


@pytest.mark.parametrize("state", [InstanceState.STOPPED, InstanceState.DOWN])
def test_a_stopped_or_down_instance_is_refused_without_a_write(
        records: Records, state: InstanceState) -> None:
    records.instance("a.test", state=state)
    before = records.store.latest_operation("a.test")
    with pytest.raises(UserError, match="only a running instance parks"):
        plan_park(records.store, ParkRequest("a.test"))
    assert records.store.latest_operation("a.test") == before


def test_every_planned_step_of_park_has_an_effect(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    plan = plan_park(records.store, ParkRequest("a.test"))
    assert {s.effect for s in plan.steps} <= set(PARK.effects)


def test_the_dry_run_of_a_park_prints_each_step_it_would_journal(records: Records) -> None:
    records.instance("a.test")
    web = records.running("a.test", "web")
    plan = plan_park(records.store, ParkRequest("a.test", why="idle"))
    assert plan.lines() == [
        "park a.test:",
        "  1. park: a.test PARKED and its route parked, in one write (idle)",
        "  2. publish: publish the route table",
        f"  3. stop: stop web generation {web.id} and prove it gone",
    ]
    shown = plan.as_json()
    assert shown["op"] == "park" and shown["instance"] == "a.test"
    steps = shown["steps"]
    assert isinstance(steps, list)
    assert [s["step"] for s in steps] == ["park", "publish", "stop"]
