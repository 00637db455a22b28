"""A scheduled job's run's plan, from records alone: its steps, its key, its refusals,
and how the reconciler ends one whose control plane is gone (as a `run`'s)."""

from __future__ import annotations

import pytest

from keelway.deploy.errors import UserError
from keelway.deploy.jobs import JOB, JobRequest, plan_job
from keelway.deploy.runs import finalize_run
from keelway.journal import OpKind, StepKind
from tests.deploy.conftest import Records

KEY = "job:nightly@2026-12-04T00:00Z"


def test_a_jobs_run_plans_its_spawn_then_its_exit_under_its_key(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    plan = plan_job(records.store, JobRequest("a.test", "nightly", KEY))
    assert plan.kind is OpKind.JOB and OpKind.JOB.one_off
    assert [(s.kind, s.effect, s.service) for s in plan.steps] == [
        (StepKind.RUN, "spawn", "job.nightly"), (StepKind.RUN_EXIT, "wait", "job.nightly")]
    assert plan.steps[0].detail == KEY
    assert plan.steps[0].before == ("job.spawn.before",)
    assert plan.steps[1].after == ("job.exit.after",)
    assert "spawn job nightly in v1" in plan.lines()[1]
    assert {s.effect for s in plan.steps} <= set(JOB.effects)
    # Ended at boot as a run is (failed, interrupted), never carried on or run again.
    assert JOB.orphaned and JOB.finalize is finalize_run and JOB.prelude is not None


def test_a_fenced_or_down_instance_runs_no_job(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.store.instances.fence("a.test", None)
    with pytest.raises(UserError, match="is fenced"):
        plan_job(records.store, JobRequest("a.test", "nightly", KEY))
    records.instance("b.test")
    with pytest.raises(UserError, match="has no release running"):
        plan_job(records.store, JobRequest("b.test", "nightly", KEY))
