"""The plans of stop, start and the attempt kinds (deploy, config, rollback, restart),
from records alone, and their dry-runs (a deploy's with the build it would stage)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from keelway.api.daemon import wire
from keelway.builds.manifest import Manifest, Mode, ServiceKind, ServiceSpec
from keelway.builds.preview import BuildPreview, preview
from keelway.deploy.deployer import (
    ATTEMPTS,
    START,
    STOP,
    AttemptRequest,
    Deployer,
    HostRequest,
    Rollout,
    plan_attempt_on,
    plan_start,
    plan_stop,
)
from keelway.deploy.errors import Fenced, UserError
from keelway.deploy.publisher import Publisher
from keelway.deploy.targets import Target
from keelway.home import Home
from keelway.journal import Cause, OpKind, StepKind
from keelway.runtime.supervisor import Supervisor
from keelway.store.lifecycle import InstanceState
from keelway.store.records import Generation, ReleaseDraft
from keelway.testing.clock import FakeClock
from keelway.testing.dump import dump
from tests.deploy.conftest import DIGEST, EXAMPLE, Records


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


# -- a deploy's dry run: the build previewed, then each instance's plan ---------------


def _deployer(records: Records, tmp_path: Path) -> tuple[Deployer, Home]:
    """The deployer as the daemon wires it, on the records' in-memory store; nothing
    here starts a process: a dry run only reads."""
    home = Home(tmp_path / "home")
    home.ensure()

    async def on_exit(_gen: Generation, _code: int | None) -> None:
        return None

    clock = FakeClock()
    parts = wire(records.store, home, Supervisor(records.store, home, clock, on_exit),
                 Publisher(records.store, home.router_socket), clock, "test")
    return parts.deployer, home


def _files(root: Path) -> list[str]:
    return sorted(str(Path(d, n).relative_to(root)) for d, ds, fs in os.walk(root)
                  for n in (*ds, *fs))


def _build(home: Home) -> BuildPreview:
    return preview(EXAMPLE, builds_dir=home.builds_dir, app="shop")


def test_a_dry_deploy_plans_each_instance_defers_a_parked_one_and_names_one_it_adds(
        records: Records, tmp_path: Path) -> None:
    records.instance("a.test")
    web = records.running("a.test", "web")
    records.instance("b.test")
    records.instance("b.test", state=InstanceState.PARKED)
    deployer, home = _deployer(records, tmp_path)
    build = _build(home)
    before, files = dump(records.store), _files(tmp_path)
    plan = deployer.dry_deploy("shop", build, ["c.test"])
    assert dump(records.store) == before and _files(tmp_path) == files
    assert records.store.ops.latest_operation("a.test") is None
    lines = plan.lines()
    assert lines[0] == (f"build {build.digest[:12]} of directory {EXAMPLE}: would be "
                        "built (nothing to install)")
    assert lines[1] == (f"release v2 of shop: build {build.digest[:12]}, config none; "
                        "services web (web, overlap), worker (worker, hold)")
    assert lines[2:4] == ["deploy a.test:", "  1. lay-down: lay a.test down whole (data "
                          "dir, databases, env file)"]
    # The example's worker swaps in hold mode (a worker's default), so the attempt does.
    assert lines[4].startswith(f"  2. spawn: attempt v2 ({build.digest[:12]}, hold): "
                               f"start web (replacing generation {web.id}), record the "
                               "execution evidence, start worker, activate")
    assert lines[5:7] == ["deploy b.test:",
                          "  1. defer: b.test is parked: v2 is left pending for its next "
                          "wake"]
    assert lines[7:9] == ["would add instance c.test", "deploy c.test:"]
    assert lines[10].startswith(f"  2. spawn: attempt v2 ({build.digest[:12]}, hold): "
                                "start web, record the execution evidence, start worker, "
                                "activate, publish, settle 1s")
    assert plan.as_json()["adds"] == ["c.test"]


def test_a_dry_deploy_plans_an_added_instance_as_the_deploy_does_once_it_is_added(
        records: Records, tmp_path: Path) -> None:
    deployer, home = _deployer(records, tmp_path)
    build = _build(home)
    (dry,) = deployer.dry_deploy("shop", build, ["c.test"]).plans
    records.instance("c.test")
    # What the deploy plans, the build staged where the preview said it would be.
    target = Target.of("shop", 1, build.digest, build.path, {}, build.manifest)
    inst = records.store.instances.get_instance("c.test")
    assert inst is not None
    ran = plan_attempt_on(records.store, AttemptRequest("c.test", Rollout(
        "shop", OpKind.DEPLOY, Cause.RELEASE, target, {"c.test": inst.schedule_rev},
        ReleaseDraft("shop", build.digest, {}, "Deploy"), _quiet, None, None)))
    assert dry == ran


def test_a_dry_deploy_with_mode_hold_stops_web_before_it_starts_the_new_one(
        records: Records, tmp_path: Path) -> None:
    records.instance("a.test")
    web = records.running("a.test", "web")
    deployer, home = _deployer(records, tmp_path)
    plan = deployer.dry_deploy("shop", _build(home), [], Mode.HOLD)
    assert plan.lines()[1].endswith("services web (web, hold), worker (worker, hold)")
    said = plan.plans[0].steps[1].describe
    assert said.startswith(f"attempt v2 ({plan.build.digest[:12]}, hold): stop web generation "
                           f"{web.id} (hold mode), record the execution evidence, start web")
    assert said.endswith("stay down after")


def test_a_dry_deploy_refuses_what_the_deploy_refuses_and_changes_nothing(
        records: Records, tmp_path: Path) -> None:
    records.instance("a.test")
    records.running("a.test", "web")
    records.instance("x.test", app="other")
    records.store.instances.fence("a.test", "migrating")
    deployer, home = _deployer(records, tmp_path)
    build = _build(home)
    before = dump(records.store)
    with pytest.raises(Fenced, match=r"a\.test is fenced .*: it cannot deploy"):
        deployer.dry_deploy("shop", build, [])
    with pytest.raises(UserError, match=r"x\.test already belongs to app other"):
        deployer.dry_deploy("shop", build, ["x.test"])
    with pytest.raises(UserError):
        deployer.dry_deploy("Bad App", build, [])
    assert dump(records.store) == before
