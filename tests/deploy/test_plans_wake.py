"""Wake's plan, from records alone: the parked path, the deferred release, the retry
now of a running instance in a crash backoff, and its dry-run."""

from __future__ import annotations

import pytest

from keelway.deploy.errors import UserError
from keelway.deploy.parking import WAKE, WakeRequest, plan_wake
from keelway.journal import Cause, OpKind, StepKind
from keelway.store.lifecycle import InstanceState
from keelway.store.records import CrashRetry
from tests.deploy.conftest import Records


def test_a_parked_wake_writes_running_first_then_starts_the_web_before_the_workers(
        records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.running("a.test", "worker")
    records.instance("a.test", state=InstanceState.PARKED)
    plan = plan_wake(records.store, WakeRequest("a.test"))
    assert plan.kind is OpKind.WAKE and plan.nothing is None
    assert [(s.kind, s.effect) for s in plan.steps] == [
        (StepKind.WAKE, "running"), (StepKind.SPAWN, "respawn-web"),
        (StepKind.SPAWN, "respawn")]
    assert plan.steps[0].before == ("wake.before",) and plan.steps[0].after == ("wake.after",)
    assert all(s.journals_own for s in plan.steps[1:])


def test_a_parked_wake_of_a_web_alone_starts_it_in_one_step(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.instance("a.test", state=InstanceState.PARKED)
    plan = plan_wake(records.store, WakeRequest("a.test"))
    assert [s.effect for s in plan.steps] == ["running", "respawn"]


def test_a_release_deferred_to_the_wake_runs_as_an_attempt_before_anything_else_starts(
        records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.instance("a.test", state=InstanceState.PARKED)
    records.store.defer_release("a.test", schedule_rev=0, number=3, cause=Cause.RELEASE,
                                release=None)
    plan = plan_wake(records.store, WakeRequest("a.test"))
    assert [s.effect for s in plan.steps] == ["running", "deferred", "respawn"]
    assert plan.steps[1].arg == 3 and "v3" in plan.steps[1].describe


def test_a_running_instance_has_nothing_to_wake(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    for retry_now in (False, True):
        plan = plan_wake(records.store, WakeRequest("a.test", retry_now))
        assert plan.steps == () and plan.nothing == "running already"


def test_an_operators_wake_of_an_instance_in_a_crash_backoff_starts_it_now(
        records: Records) -> None:
    records.instance("a.test")
    web = records.gone(records.running("a.test", "web"))
    records.store.record_crash(CrashRetry("a.test", "web", web.id, 2, 100.0, 160.0))
    assert plan_wake(records.store, WakeRequest("a.test")).nothing == "running already"
    plan = plan_wake(records.store, WakeRequest("a.test", retry_now=True))
    assert [(s.kind, s.effect) for s in plan.steps] == [(StepKind.SPAWN, "respawn")]


@pytest.mark.parametrize("state", [InstanceState.STOPPED, InstanceState.DOWN])
def test_a_stopped_or_down_instance_is_not_woken(records: Records,
                                                 state: InstanceState) -> None:
    records.instance("a.test", state=state)
    with pytest.raises(UserError, match="a wake does not start it"):
        plan_wake(records.store, WakeRequest("a.test"))
    assert records.store.latest_operation("a.test") is None


def test_every_planned_step_of_a_wake_has_an_effect(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.running("a.test", "worker")
    records.instance("a.test", state=InstanceState.PARKED)
    records.store.defer_release("a.test", schedule_rev=0, number=2, cause=Cause.RELEASE,
                                release=None)
    plan = plan_wake(records.store, WakeRequest("a.test"))
    assert {s.effect for s in plan.steps} <= set(WAKE.effects)
    assert WAKE.fence_verb == "wake"


def test_the_dry_run_of_a_wake_prints_each_step(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.instance("a.test", state=InstanceState.PARKED)
    assert plan_wake(records.store, WakeRequest("a.test")).lines() == [
        "wake a.test:",
        "  1. wake: a.test RUNNING, before anything of it spawns",
        "  2. spawn: start what ACTIVE names and publish its route",
    ]
