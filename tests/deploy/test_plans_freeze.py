"""Freeze's plan and a frozen instance's wake (the thaw), from records alone
(keelway/deploy/freezing.py, keelway/deploy/parking.py)."""

from __future__ import annotations

import pytest

from keelway.deploy.errors import UserError
from keelway.deploy.freezing import FreezeRequest, plan_freeze, set_route
from keelway.deploy.parking import WakeRequest, plan_wake
from keelway.journal import OpKind, StepKind
from keelway.store.lifecycle import InstanceState, RouteState
from tests.deploy.conftest import Records


def _serving(records: Records, host: str = "a.test") -> None:
    records.instance(host)
    web = records.running(host, "web")
    records.running(host, "worker")
    records.running(host, "replica", active=False)
    records.store.routes.set_route(host, host, RouteState.SERVING, 8001, web.id,
                                   expected=records.store.routes.get_route(host))


def test_a_freeze_plans_the_route_the_publish_then_the_freeze_of_all_but_the_replicator(
        records: Records) -> None:
    _serving(records)
    plan = plan_freeze(records.store, FreezeRequest("a.test", "idle for 60s"))
    assert plan.kind is OpKind.FREEZE and plan.nothing is None
    assert [s.kind for s in plan.steps] == [StepKind.FREEZE_ROUTE, StepKind.PUBLISH,
                                            StepKind.FREEZE]
    assert plan.steps[0].before == ("freeze.route.before",)
    assert plan.steps[2].before == ("freeze.before",) and plan.steps[2].after == (
        "freeze.after",)
    assert "web generation" in plan.steps[2].describe
    assert "worker generation" in plan.steps[2].describe
    assert "replica" not in plan.steps[2].describe
    assert "idle for 60s" in plan.lines()[1]


def test_a_frozen_instance_plans_nothing_and_its_wake_is_a_thaw(records: Records) -> None:
    _serving(records)
    set_route(records.store, "a.test", RouteState.FROZEN)
    assert plan_freeze(records.store, FreezeRequest("a.test")).nothing == "frozen already"
    wake = plan_wake(records.store, WakeRequest("a.test"))
    assert wake.kind is OpKind.WAKE
    assert [s.kind for s in wake.steps] == [StepKind.THAW, StepKind.THAW_ROUTE,
                                            StepKind.PUBLISH]
    route = records.store.routes.get_route("a.test")
    assert route is not None and route.port == 8001  # kept, for the thaw to serve on


def test_only_a_running_serving_instance_freezes(records: Records) -> None:
    records.instance("p.test", state=InstanceState.PARKED)
    with pytest.raises(UserError, match="only a running instance"):
        plan_freeze(records.store, FreezeRequest("p.test"))
    records.instance("n.test")
    with pytest.raises(UserError, match="not serving"):
        plan_freeze(records.store, FreezeRequest("n.test"))
