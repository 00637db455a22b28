"""The plans of the respawn kinds (keelway/deploy/crash_restarts.py): RECOVER, the
reconciler's RESTART_ACTIVE, and RESTART_CRASHED, a published generation's restart once
its backoff is over; and REPLICATE (keelway/deploy/replica_keeper.py), the reconciler's
START_REPLICA. Daemon-less, on the `records` fixture."""

from __future__ import annotations

import pytest

from keelway.deploy.crash_restarts import Respawn, plan_respawn
from keelway.deploy.operation import OperationError
from keelway.deploy.replica_keeper import Replicate, plan_replicate
from keelway.journal import OpKind, StepKind
from keelway.store.lifecycle import InstanceState
from tests.deploy.conftest import Records

HOST = "a.test"


def test_a_recover_starts_what_active_names_that_is_not_alive_then_publishes_in_one_step(
        records: Records) -> None:
    records.instance(HOST)
    records.running(HOST)
    plan = plan_respawn(records.store, Respawn(HOST))
    assert plan.kind is OpKind.RECOVER and plan.nothing is None
    assert [(s.kind, s.effect) for s in plan.steps] == [(StepKind.SPAWN, "respawn")]
    # Its step journals its own spawns (each generation's start is journaled by
    # generation_start), so the runner writes no step record around it.
    assert plan.steps[0].journals_own


def test_a_recover_says_which_services_it_leaves_to_their_crash_backoff(
        records: Records) -> None:
    records.instance(HOST)
    records.running(HOST)
    lines = plan_respawn(records.store, Respawn(HOST, frozenset({"worker"}))).lines()
    assert lines[0] == f"recover {HOST}:"
    assert "(worker left to their backoff)" in lines[1]


def test_a_crash_restart_restarts_the_generation_active_still_names(records: Records) -> None:
    records.instance(HOST)
    web = records.running(HOST)
    plan = plan_respawn(records.store, Respawn(HOST, crashed=("web", web.id)))
    assert plan.kind is OpKind.RESTART_CRASHED and plan.nothing is None
    assert [s.kind for s in plan.steps] == [StepKind.SPAWN]


def test_a_crash_restart_has_nothing_to_do_once_something_newer_took_over(
        records: Records) -> None:
    records.instance(HOST)
    crashed = records.running(HOST)
    records.running(HOST)  # a newer web is ACTIVE now (a deploy meanwhile)
    plan = plan_respawn(records.store, Respawn(HOST, crashed=("web", crashed.id)))
    assert plan.kind is OpKind.RESTART_CRASHED and plan.steps == ()
    assert plan.nothing is not None and "newer" in plan.nothing


@pytest.mark.parametrize("held", ["fenced", "stopped", "parked"])
def test_a_crash_restart_has_nothing_to_do_while_a_fence_or_a_state_holds_it(
        records: Records, held: str) -> None:
    records.instance(HOST)
    web = records.running(HOST)
    if held == "fenced":
        records.store.instances.fence(HOST, "an operator looks at it")
    else:
        records.instance(HOST, state=InstanceState(held))
    plan = plan_respawn(records.store, Respawn(HOST, crashed=("web", web.id)))
    assert plan.steps == () and plan.nothing is not None
    assert plan.lines() == [f"restart-crashed {HOST}: nothing to do ({plan.nothing})"]


def test_a_respawn_of_an_instance_that_is_gone_is_refused(records: Records) -> None:
    with pytest.raises(OperationError):
        plan_respawn(records.store, Respawn("gone.test"))


def test_a_replicate_has_no_step_of_its_own(records: Records) -> None:
    """Its whole work is the replication hook that follows every operation."""
    records.instance(HOST)
    plan = plan_replicate(records.store, Replicate(HOST))
    assert plan.kind is OpKind.REPLICATE and plan.steps == () and plan.nothing is None
    assert plan.lines() == [f"replicate {HOST}:"]
