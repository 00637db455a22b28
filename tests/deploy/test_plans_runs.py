"""A one-off run's plan, from records alone, its refusals, and how the reconciler ends
one whose control plane is gone."""

from __future__ import annotations

import pytest

from keelway.deploy.errors import UserError
from keelway.deploy.runs import INTERRUPTED, RUN, RunRequest, finalize_run, plan_run
from keelway.journal import OpKind, StepKind
from keelway.store.lifecycle import InstanceState, OpState
from tests.deploy.conftest import Records


def test_a_run_plans_its_spawn_then_its_exit_in_the_release_that_runs(
        records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    plan = plan_run(records.store, RunRequest("a.test", "psql"))
    assert plan.kind is OpKind.RUN
    assert [(s.kind, s.effect) for s in plan.steps] == [(StepKind.RUN, "spawn"),
                                                        (StepKind.RUN_EXIT, "wait")]
    # The program name alone is journaled, never an argument (it may be a secret).
    assert plan.steps[0].detail == "psql"
    assert plan.steps[0].before == ("run.spawn.before",)
    assert plan.steps[1].after == ("run.exit.after",)
    assert "spawn psql in v1" in plan.lines()[1]
    assert {s.effect for s in plan.steps} <= set(RUN.effects)


def test_a_fenced_instance_runs_nothing(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.store.fence("a.test", None)
    with pytest.raises(UserError, match="is fenced: nothing of it may start"):
        plan_run(records.store, RunRequest("a.test", "sh"))


def test_a_down_instance_runs_nothing(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.store.take_out_of_service("a.test", InstanceState.DOWN, "hold release failed")
    with pytest.raises(UserError, match="is down: hold release failed"):
        plan_run(records.store, RunRequest("a.test", "sh"))


def test_an_instance_that_runs_no_release_runs_nothing(records: Records) -> None:
    records.instance("a.test")
    with pytest.raises(UserError, match="has no release running"):
        plan_run(records.store, RunRequest("a.test", "sh"))


def test_a_run_its_control_plane_lost_is_failed_whatever_its_steps_say(
        records: Records) -> None:
    inst = records.instance("a.test")
    op = records.store.begin_operation(inst.app, inst.host, OpKind.RUN, "gone")
    verdict = finalize_run(op)
    assert verdict.state is OpState.FAILED and verdict.reason == INTERRUPTED
    assert RUN.orphaned and RUN.finalize is finalize_run
