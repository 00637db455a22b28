"""The plans of stop, start and the attempt kinds (deploy, config, rollback, restart),
from records alone, and their dry-runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.builds.manifest import Manifest, Mode, ServiceKind, ServiceSpec
from keelway.deploy.deployer import (
    ATTEMPTS,
    START,
    STOP,
    AttemptRequest,
    HostRequest,
    Rollout,
    plan_attempt_on,
    plan_start,
    plan_stop,
)
from keelway.deploy.errors import Fenced
from keelway.deploy.targets import Target
from keelway.journal import Cause, OpKind, StepKind
from keelway.store.lifecycle import InstanceState
from keelway.store.records import ReleaseDraft
from tests.deploy.conftest import DIGEST, Records


def _quiet(_message: str) -> None:
    pass


def rollout(records: Records, kind: OpKind = OpKind.DEPLOY, *, hold: bool = False,
            rev: int | None = None) -> Rollout:
    mode = Mode.HOLD if hold else Mode.OVERLAP
    manifest = Manifest({"web": ServiceSpec("web", "run web", ServiceKind.WEB, mode,
                                            settle_s=2.0)})
    inst = records.store.instances.get_instance("a.test")
    assert inst is not None
    cause = {OpKind.CONFIG: Cause.CONFIG, OpKind.RESTART: Cause.RESTART}.get(kind,
                                                                          Cause.RELEASE)
    return Rollout("shop", kind, cause,
                   Target("shop", 2, DIGEST, Path("/builds/shop"), {}, manifest),
                   {"a.test": inst.schedule_rev if rev is None else rev},
                   ReleaseDraft("shop", DIGEST, {}, "Deploy"), _quiet, None, None)


def test_a_stop_plans_out_of_service_then_a_stop_of_each_generation(
        records: Records) -> None:
    records.instance("a.test")
    web = records.running("a.test", "web")
    records.running("a.test", "replica", active=False)
    plan = plan_stop(records.store, HostRequest("a.test"))
    assert [(s.kind, s.before_gen) for s in plan.steps] == [
        (StepKind.OUT_OF_SERVICE, None), (StepKind.STOP, web.id)]
    assert plan.steps[0].before == ("service.out.before",)
    assert {s.effect for s in plan.steps} <= set(STOP.effects)
    assert STOP.fence_verb is None  # a fence never keeps an instance from stopping
    assert plan.lines()[1] == ("  1. out-of-service: a.test STOPPED and its route gated "
                               "(503) in one write, then published")


def test_a_start_plans_in_service_then_the_respawn_of_what_active_names(
        records: Records) -> None:
    records.instance("a.test", state=InstanceState.STOPPED)
    plan = plan_start(records.store, HostRequest("a.test"))
    assert [(s.kind, s.journals_own) for s in plan.steps] == [
        (StepKind.IN_SERVICE, False), (StepKind.SPAWN, True)]
    assert {s.effect for s in plan.steps} <= set(START.effects)
    assert START.fence_verb == "start"
    assert plan.lines() == ["start a.test:", "  1. in-service: a.test RUNNING",
                            "  2. spawn: start what ACTIVE names and publish its route"]


def test_an_attempt_lays_the_instance_down_then_runs_the_attempts_own_plan(
        records: Records) -> None:
    records.instance("a.test")
    web = records.running("a.test", "web")
    plan = plan_attempt_on(records.store, AttemptRequest("a.test", rollout(records)))
    assert [(s.kind, s.effect, s.journals_own) for s in plan.steps] == [
        (StepKind.LAY_DOWN, "lay-down", True), (StepKind.SPAWN, "attempt", True)]
    said = plan.steps[1].describe
    assert said.startswith("attempt v2 (")
    assert (f"start web (replacing generation {web.id}), activate, publish, settle 2s, "
            f"verify, mark the build good, retire web generation {web.id}") in said
    assert said.endswith("on failure: the last good build, or stop")


def test_a_hold_release_says_its_fallback_turns_on_the_execution_evidence(
        records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    plan = plan_attempt_on(records.store, AttemptRequest("a.test", rollout(records,
                                                                           hold=True)))
    assert "record the execution evidence" in plan.steps[1].describe
    assert plan.steps[1].describe.endswith(
        "the last good build, or stop before anything new executes, stay down after")


def test_a_restart_never_marks_its_build_good(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    plan = plan_attempt_on(records.store, AttemptRequest(
        "a.test", rollout(records, OpKind.RESTART)))
    assert plan.kind is OpKind.RESTART
    assert "mark the build good" not in plan.steps[1].describe
    assert plan.steps[1].describe.endswith("on failure: respawn what it replaced")


def test_an_attempt_superseded_before_it_starts_plans_nothing(records: Records) -> None:
    records.instance("a.test")
    stale = rollout(records, rev=0)
    records.store.instances.bump_schedule("a.test")
    plan = plan_attempt_on(records.store, AttemptRequest("a.test", stale))
    assert plan.steps == () and plan.nothing == "superseded before it started"


def test_a_parked_instance_gets_its_release_deferred_fenced_or_not(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.instance("a.test", state=InstanceState.PARKED)
    records.store.instances.fence("a.test", None)
    plan = plan_attempt_on(records.store, AttemptRequest("a.test", rollout(records)))
    assert [(s.kind, s.arg) for s in plan.steps] == [(StepKind.DEFER, 2)]
    assert plan.steps[0].before == ("defer.before",) and plan.steps[0].after == (
        "defer.after",)


def test_a_fenced_running_instance_refuses_an_attempt_of_any_kind(records: Records) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.store.instances.fence("a.test", "migrating")
    for kind in ATTEMPTS:
        with pytest.raises(Fenced, match=f"it cannot {kind.value}"):
            plan_attempt_on(records.store, AttemptRequest("a.test", rollout(records, kind)))
    assert records.store.ops.latest_operation("a.test") is None


def test_every_attempt_kind_shares_one_plan_and_its_effects(records: Records) -> None:
    assert set(ATTEMPTS) == {OpKind.DEPLOY, OpKind.CONFIG, OpKind.ROLLBACK, OpKind.RESTART}
    for kind, spec in ATTEMPTS.items():
        assert spec.kind is kind and spec.plan is plan_attempt_on
        assert set(spec.effects) == {"lay-down", "attempt", "defer"}
