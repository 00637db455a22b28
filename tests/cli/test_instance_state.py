"""The one rule of what state `status` shows (keelway/api/instance_state.py), from
records alone: one test per state and the cases between them, and the phrases."""

from __future__ import annotations

import time

from keelway.api.instance_state import InstanceStatus, Shown, decide, label
from keelway.journal import OpKind
from keelway.store.lifecycle import GenState, InstanceState, OpState
from keelway.store.records import CrashRetry, Generation, Instance, Operation

NOW = 1_000_000.0
HOST = "one.test"


def _inst(state: InstanceState = InstanceState.RUNNING,
          pending: int | None = None) -> Instance:
    return Instance(HOST, "hello", state, 0, 0, NOW, 1, pending_release=pending)


def _gen(service: str, release: int = 1, state: GenState = GenState.READY,
         gen_id: int = 1) -> Generation:
    return Generation(gen_id, "hello", HOST, service, release, "d" * 64, None, state,
                      NOW, None, None, 1)


def _op(op_id: int, kind: OpKind, state: OpState) -> Operation:
    return Operation(op_id, "hello", HOST, kind, None, None, state, None, [], "me", NOW,
                     NOW, 1)


def _retry(at: float) -> CrashRetry:
    return CrashRetry(HOST, "web", 1, 2, NOW - 1, at)


def _decide(inst: Instance | None = None, active: dict[str, Generation] | None = None,
            retries: list[CrashRetry] | None = None, release_op: Operation | None = None,
            service_op: Operation | None = None) -> InstanceStatus:
    return decide(inst or _inst(), active or {}, retries or [], release_op, service_op, NOW)


def test_an_instance_with_alive_processes_is_running_on_their_release() -> None:
    status = _decide(active={"web": _gen("web", 2), "worker": _gen("worker", 2, gen_id=2)})
    assert (status.state, status.release, status.serving) == (Shown.RUNNING, 2, 2)


def test_an_instance_nothing_was_released_to_has_no_release() -> None:
    assert _decide().state is Shown.NO_RELEASE
    assert _decide(_inst(InstanceState.PARKED)).state is Shown.NO_RELEASE


def test_a_parked_instance_keeps_its_release_and_serves_nothing() -> None:
    status = _decide(_inst(InstanceState.PARKED),
                     active={"web": _gen("web", 3, GenState.GONE)})
    assert (status.state, status.release, status.serving) == (Shown.PARKED, 3, None)


def test_a_stopped_instance_is_stopped_even_with_nothing_released() -> None:
    assert _decide(_inst(InstanceState.STOPPED)).state is Shown.STOPPED


def test_a_dead_web_waiting_out_its_backoff_is_crashed_with_its_next_retry() -> None:
    status = _decide(active={"web": _gen("web", 1, GenState.GONE)}, retries=[_retry(NOW + 5)])
    assert (status.state, status.next_retry_at, status.release) == (Shown.CRASHED, NOW + 5, 1)


def test_a_parked_instance_inside_its_backoff_is_crashed_and_once_due_parked() -> None:
    parked = _inst(InstanceState.PARKED)
    gone = {"web": _gen("web", 1, GenState.GONE)}
    assert _decide(parked, gone, [_retry(NOW + 5)]).state is Shown.CRASHED
    assert _decide(parked, gone, [_retry(NOW - 5)]).state is Shown.PARKED


def test_a_dead_web_with_no_retry_scheduled_is_crashed_and_an_alive_worker_serves_nobody() -> None:
    status = _decide(active={"web": _gen("web", 1, GenState.GONE),
                             "worker": _gen("worker", 1, gen_id=2)})
    assert (status.state, status.serving) == (Shown.CRASHED, None)


def test_a_worker_that_exited_0_has_completed_and_one_that_failed_has_crashed() -> None:
    done = Generation(2, "hello", HOST, "worker", 1, "d" * 64, None, GenState.GONE,
                      NOW, NOW, 0, 2)
    assert _decide(active={"web": _gen("web"), "worker": done}).state is Shown.RUNNING
    failed = Generation(2, "hello", HOST, "worker", 1, "d" * 64, None, GenState.GONE,
                        NOW, NOW, 1, 2)
    assert _decide(active={"web": _gen("web"), "worker": failed}).state is Shown.CRASHED


def test_a_failed_first_deploy_is_failed_serving_nothing() -> None:
    status = _decide(release_op=_op(1, OpKind.DEPLOY, OpState.FAILED))
    assert (status.state, status.failed, status.serving) == (Shown.FAILED, OpKind.DEPLOY, None)
    stopped = _decide(_inst(InstanceState.STOPPED), {"web": _gen("web", 1, GenState.GONE)},
                      release_op=_op(1, OpKind.DEPLOY, OpState.FAILED))
    assert stopped.state is Shown.FAILED and stopped.serving is None


def test_a_failed_later_release_is_failed_serving_what_it_fell_back_to() -> None:
    status = _decide(active={"web": _gen("web", 1)},
                     release_op=_op(5, OpKind.CONFIG, OpState.FAILED))
    assert (status.state, status.failed, status.serving) == (Shown.FAILED, OpKind.CONFIG, 1)


def test_a_hold_release_that_went_down_is_failed_serving_nothing() -> None:
    status = _decide(_inst(InstanceState.DOWN), {"web": _gen("web", 2, GenState.GONE)},
                     release_op=_op(3, OpKind.DEPLOY, OpState.FAILED))
    assert (status.state, status.serving) == (Shown.FAILED, None)


def test_a_stop_or_start_after_a_failed_release_is_what_holds() -> None:
    failed = _op(3, OpKind.DEPLOY, OpState.FAILED)
    stopped = _decide(_inst(InstanceState.STOPPED), {"web": _gen("web", 1, GenState.GONE)},
                      release_op=failed, service_op=_op(4, OpKind.STOP, OpState.SUCCEEDED))
    assert stopped.state is Shown.STOPPED
    started = _decide(active={"web": _gen("web", 1)}, release_op=failed,
                      service_op=_op(5, OpKind.START, OpState.SUCCEEDED))
    assert started.state is Shown.RUNNING


def test_a_release_that_succeeded_after_a_failure_clears_it() -> None:
    status = _decide(active={"web": _gen("web", 3)},
                     release_op=_op(6, OpKind.DEPLOY, OpState.SUCCEEDED))
    assert status.state is Shown.RUNNING


def test_every_state_has_its_phrase() -> None:
    at = time.strftime("%H:%M:%S", time.localtime(NOW + 5))
    phrases = {
        label(InstanceStatus(Shown.RUNNING, 1, 1)): "running",
        label(InstanceStatus(Shown.FROZEN, 1, 1)): "frozen",
        label(InstanceStatus(Shown.PARKED, 1, None)): "parked",
        label(InstanceStatus(Shown.STOPPED, 1, None)): "stopped",
        label(InstanceStatus(Shown.NO_RELEASE, None, None)): "no release",
        label(InstanceStatus(Shown.CRASHED, 1, None, next_retry_at=NOW + 5)):
            f"crashed (next retry at {at})",
        label(InstanceStatus(Shown.FAILED, 2, 1, failed=OpKind.DEPLOY)):
            "failed (last deploy failed; serving v1)",
        label(InstanceStatus(Shown.FAILED, 1, None, failed=OpKind.ROLLBACK)):
            "failed (last rollback failed; serving nothing)",
    }
    assert all(said == want for said, want in phrases.items()), phrases
    assert {s for s in Shown} == {Shown(p.split(" (")[0]) for p in phrases.values()}


def test_a_running_instance_whose_route_is_frozen_is_frozen_and_a_crash_still_shows() -> None:
    active = {"web": _gen("web", 2)}
    frozen = decide(_inst(), active, [], None, None, NOW, frozen=True)
    assert frozen.state is Shown.FROZEN and label(frozen) == "frozen" and frozen.serving == 2
    crashed = decide(_inst(), {"web": _gen("web", 1, GenState.GONE)}, [_retry(NOW + 5)],
                     None, None, NOW, frozen=True)
    assert crashed.state is Shown.CRASHED
