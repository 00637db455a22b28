"""An attempt's steps, planned from records alone (no daemon, no processes)."""

from __future__ import annotations

from keelway.builds.manifest import Manifest, Mode, ServiceKind, ServiceSpec
from keelway.deploy.plan import (
    Activate,
    AttemptStep,
    BeginHoldExec,
    MarkGood,
    Publish,
    Retire,
    RunReleaseCommand,
    Settle,
    StartCandidate,
    StopReplaced,
    Verify,
    Withdraw,
    plan_attempt,
    respawns,
)
from keelway.journal import Cause
from keelway.store.lifecycle import GenState
from keelway.store.records import Generation

HOST = "one.test"


def spec(name: str, mode: Mode, settle_s: float = 1.0) -> ServiceSpec:
    kind = ServiceKind.WEB if name == "web" else ServiceKind.WORKER
    return ServiceSpec(name, f"run {name}", kind, mode, settle_s=settle_s)


def manifest(*specs: ServiceSpec, release: str | None = None) -> Manifest:
    return Manifest({s.name: s for s in specs}, release_command=release)


def gen(gen_id: int, service: str) -> Generation:
    return Generation(gen_id, "hello", HOST, service, 1, "d" * 64, 1, GenState.READY,
                      0.0, None, None, 1)


def shape(steps: tuple[AttemptStep, ...]) -> list[str]:
    """The steps as words: which step, and of which service."""
    out = []
    for step in steps:
        name = type(step).__name__
        match step:
            case StartCandidate() | StopReplaced() | Retire():
                out.append(f"{name} {step.spec.name}")
            case BeginHoldExec():
                out.append(f"{name}{' +evidence' if step.evidence else ''}")
            case _:
                out.append(name)
    return out


WEB = spec("web", Mode.OVERLAP)
WORKER = spec("worker", Mode.HOLD)


def test_a_first_overlap_deploy_starts_installs_publishes_settles_and_marks_good() -> None:
    plan = plan_attempt(manifest(WEB), {}, Cause.RELEASE, routed=False)
    assert shape(plan.steps) == ["StartCandidate web", "Activate", "Publish", "Settle",
                                 "Verify", "MarkGood"]
    assert plan.mode is Mode.OVERLAP


def test_an_overlap_redeploy_retires_the_old_generation_last() -> None:
    old = gen(1, "web")
    plan = plan_attempt(manifest(WEB), {"web": old}, Cause.RELEASE, routed=True)
    assert shape(plan.steps)[-1] == "Retire web"
    assert plan.steps[0] == StartCandidate(WEB, old)
    assert plan.overlap == {"web"}


def test_a_restart_does_not_mark_its_build_good_again() -> None:
    plan = plan_attempt(manifest(WEB), {"web": gen(1, "web")}, Cause.RESTART, routed=True)
    assert not any(isinstance(s, MarkGood) for s in plan.steps)


def test_a_config_change_marks_its_build_good() -> None:
    plan = plan_attempt(manifest(WEB), {"web": gen(1, "web")}, Cause.CONFIG, routed=True)
    assert any(isinstance(s, MarkGood) for s in plan.steps)


def test_a_hold_release_stops_the_old_worker_and_journals_the_evidence_before_it_starts() -> None:
    old = gen(2, "worker")
    plan = plan_attempt(manifest(WORKER), {"worker": old}, Cause.RELEASE, routed=False)
    assert shape(plan.steps) == ["StopReplaced worker", "BeginHoldExec +evidence",
                                 "StartCandidate worker", "Activate", "Publish", "Settle",
                                 "Verify", "MarkGood"]
    assert plan.mode is Mode.HOLD


def test_a_hold_restart_journals_no_execution_evidence() -> None:
    plan = plan_attempt(manifest(WORKER), {"worker": gen(2, "worker")}, Cause.RESTART,
                        routed=False)
    assert BeginHoldExec(evidence=False) in plan.steps


def test_web_goes_first_so_its_overlap_swap_is_verified_before_a_held_worker_stops() -> None:
    plan = plan_attempt(manifest(WORKER, WEB), {"web": gen(1, "web"), "worker": gen(2, "worker")},
                        Cause.RELEASE, routed=True)
    words = shape(plan.steps)
    assert words.index("StartCandidate web") < words.index("StopReplaced worker")
    assert words.index("StopReplaced worker") < words.index("StartCandidate worker")
    assert words[-1] == "Retire web"  # only the overlap service is retired
    assert plan.mode is Mode.HOLD  # the held part decides the fallback


def test_a_held_web_withdraws_traffic_before_its_old_generation_stops() -> None:
    web = spec("web", Mode.HOLD)
    plan = plan_attempt(manifest(web), {"web": gen(1, "web")}, Cause.RELEASE, routed=True)
    assert shape(plan.steps)[:2] == ["Withdraw", "StopReplaced web"]


def test_a_held_web_with_no_route_has_no_traffic_to_withdraw() -> None:
    web = spec("web", Mode.HOLD)
    plan = plan_attempt(manifest(web), {}, Cause.RELEASE, routed=False)
    assert not any(isinstance(s, Withdraw) for s in plan.steps)


def test_the_release_command_runs_first_when_nothing_is_held() -> None:
    plan = plan_attempt(manifest(WEB, release="migrate"), {}, Cause.RELEASE, routed=False)
    assert isinstance(plan.steps[0], RunReleaseCommand)


def test_the_release_command_runs_after_the_hold_evidence_and_before_the_held_start() -> None:
    plan = plan_attempt(manifest(WEB, WORKER, release="migrate"), {"worker": gen(2, "worker")},
                        Cause.RELEASE, routed=False)
    words = shape(plan.steps)
    assert words.count("RunReleaseCommand") == 1
    assert (words.index("BeginHoldExec +evidence") < words.index("RunReleaseCommand")
            < words.index("StartCandidate worker"))


def test_a_held_service_with_nothing_running_has_nothing_to_stop() -> None:
    plan = plan_attempt(manifest(WORKER), {}, Cause.RELEASE, routed=False)
    assert not any(isinstance(s, StopReplaced) for s in plan.steps)
    assert any(isinstance(s, BeginHoldExec) for s in plan.steps)


def test_the_settle_window_is_the_longest_of_the_services() -> None:
    plan = plan_attempt(manifest(spec("web", Mode.OVERLAP, 2.0), spec("worker", Mode.HOLD, 5.0)),
                        {}, Cause.RELEASE, routed=False)
    assert Settle(5.0) in plan.steps


def test_the_install_publish_settle_and_last_check_come_in_that_order() -> None:
    plan = plan_attempt(manifest(WEB), {}, Cause.CONFIG, routed=False)
    core = [s for s in plan.steps if isinstance(s, (Activate, Publish, Settle, Verify))]
    assert [type(s) for s in core] == [Activate, Publish, Settle, Verify]


def test_the_fallback_starts_only_services_whose_old_generation_is_gone() -> None:
    old_web, old_worker = gen(1, "web"), gen(2, "worker")
    starts = respawns(manifest(WEB, WORKER), {"web": old_web}, manifest(WEB, WORKER),
                      {"web": old_web, "worker": old_worker})
    assert starts == [(WORKER, old_worker)]


def test_the_fallback_starts_nothing_without_a_build_to_fall_back_to() -> None:
    assert respawns(manifest(WEB), {}, None, {}) == []


def test_the_fallback_skips_a_service_the_fallback_build_does_not_have() -> None:
    starts = respawns(manifest(WEB, WORKER), {}, manifest(WEB), {})
    assert starts == [(WEB, None)]
