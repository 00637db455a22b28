"""The contract of `OperationStore` (store.ops: operations, steps, idempotency keys,
events), on every backend."""

from __future__ import annotations

import pytest

from keelway.journal import OpKind, StepKind
from keelway.store import Conflict, NotFound, Store
from keelway.store.lifecycle import (
    IllegalTransition,
    OpState,
    RequestState,
    StepState,
)
from keelway.store.records import DurationCounts, OperationCount
from keelway.testing.clock import FakeClock
from tests.store.contract.helpers import (
    DIGEST,
    _instance,
)


def test_a_stale_or_finished_operation_is_refused_and_keeps_its_outcome(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    done = store.ops.finish_operation(op, OpState.FAILED, error="first")
    with pytest.raises(Conflict):
        store.ops.finish_operation(op, OpState.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        store.ops.finish_operation(done, OpState.SUCCEEDED)
    kept = store.ops.get_operation(op.id)
    assert kept is not None and (kept.state, kept.error) == (OpState.FAILED, "first")


def test_warnings_merge_whatever_version_the_caller_read(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    store.ops.add_warnings(op, ["one"])
    merged = store.ops.add_warnings(op, ["one", "two"])  # `op` is stale: a fact still lands
    assert merged.warnings == ["one", "two"]


def test_an_idempotency_key_is_claimed_once_and_its_outcome_recorded_once(
    store: Store,
) -> None:
    claimed, new = store.ops.begin_request("k1", "blog", "deploy", "sha", owner="me")
    again, second = store.ops.begin_request("k1", "blog", "deploy", "other", owner="you")
    assert (new, second) == (True, False)
    assert again == claimed
    assert [r.key for r in store.ops.running_requests()] == ["k1"]
    store.ops.finish_request("k1", RequestState.SUCCEEDED, "first")
    store.ops.finish_request("k1", RequestState.FAILED, "second")
    done = store.ops.get_request("k1")
    assert done is not None and (done.state, done.result) == (RequestState.SUCCEEDED, "first")
    assert store.ops.running_requests() == []


def test_finishing_a_step_that_does_not_exist_is_refused(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    assert [store.ops.begin_step(op.id, StepKind.SPAWN),
            store.ops.begin_step(op.id, StepKind.READY)] == [1, 2]
    with pytest.raises(NotFound):
        store.ops.finish_step(op.id, 3, StepState.SUCCEEDED)
    assert [s.state for s in store.ops.steps(op.id)] == [StepState.PENDING, StepState.PENDING]


def test_a_duplicate_idempotency_key_is_a_conflict_and_writes_nothing(store: Store) -> None:
    first = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k")
    with pytest.raises(Conflict):
        store.ops.begin_operation("blog", "a.test", OpKind.RESTART, owner="me", key="k")
    latest = store.ops.latest_operation("a.test")
    assert latest is not None and latest.id == first.id


def test_an_operation_is_found_by_its_key_on_its_instance_only(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k1")
    assert store.ops.find_operation_by_key("a.test", "k1") == op
    assert store.ops.find_operation_by_key("b.test", "k1") is None
    assert store.ops.find_operation_by_key("a.test", "k2") is None


def test_operations_are_listed_newest_first_per_app_and_instance(store: Store) -> None:
    one = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    two = store.ops.begin_operation("blog", "b.test", OpKind.CONFIG, owner="me")
    three = store.ops.begin_operation("blog", "a.test", OpKind.RESTART, owner="me")
    store.ops.begin_operation("shop", "s.test", OpKind.DEPLOY, owner="me")
    assert [o.id for o in store.ops.list_operations("blog")] == [three.id, two.id, one.id]
    assert [o.id for o in store.ops.list_operations("blog", "a.test")] == [three.id, one.id]
    assert [o.id for o in store.ops.list_operations("blog", limit=1)] == [three.id]


def test_each_instances_latest_operation_of_kinds_is_read_at_once_oldest_first(
        store: Store) -> None:
    first = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    other = store.ops.begin_operation("blog", "b.test", OpKind.DEPLOY, owner="me")
    run = store.ops.begin_operation("blog", "a.test", OpKind.RUN, owner="me")
    store.ops.finish_operation(other, OpState.SUCCEEDED)
    assert [o.id for o in store.ops.latest_operations_of({OpKind.DEPLOY})] == [
        first.id, other.id]
    assert [o.id for o in store.ops.latest_operations_of({OpKind.RUN, OpKind.DEPLOY})] == [
        other.id, run.id]
    assert store.ops.latest_operations_of({OpKind.STOP}) == []


def test_a_run_is_never_the_latest_operation_but_is_found_when_asked_for(
        store: Store) -> None:
    deploy = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    run = store.ops.begin_operation("blog", "a.test", OpKind.RUN, owner="me")
    latest = store.ops.latest_operation("a.test")
    assert latest is not None and latest.id == deploy.id
    of = store.ops.latest_operation_of("a.test", {OpKind.RUN, OpKind.DEPLOY})
    assert of is not None and of.id == run.id
    only = store.ops.latest_operation_of("a.test", {OpKind.DEPLOY})
    assert only is not None and only.id == deploy.id
    assert store.ops.latest_operation_of("a.test", {OpKind.STOP}) is None
    assert [o.id for o in store.ops.unfinished_runs()] == [run.id]
    store.ops.finish_operation(run, OpState.SUCCEEDED)
    assert store.ops.unfinished_runs() == []


def test_a_jobs_run_is_a_one_off_keyed_once_per_scheduled_time(store: Store) -> None:
    deploy = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    job = store.ops.begin_operation("blog", "a.test", OpKind.JOB, owner="me",
                                    key="job:nightly@2026-12-03T00:00Z")
    latest = store.ops.latest_operation("a.test")
    assert latest is not None and latest.id == deploy.id
    assert [o.id for o in store.ops.unfinished_runs()] == [job.id]
    # The run of one schedule's time is begun once, whoever asks again.
    with pytest.raises(Conflict):
        store.ops.begin_operation("blog", "a.test", OpKind.JOB, owner="me",
                                  key="job:nightly@2026-12-03T00:00Z")
    store.ops.begin_operation("blog", "b.test", OpKind.JOB, owner="me",
                              key="job:nightly@2026-12-03T00:00Z")
    store.ops.begin_operation("blog", "a.test", OpKind.RUN, owner="me")
    store.ops.begin_operation("shop", "c.test", OpKind.JOB, owner="me", key="job:x@t")
    keyed = store.ops.keyed_operations(OpKind.JOB, 0.0, app="blog")
    assert [(o.instance, o.key) for o in keyed] == [
        ("a.test", "job:nightly@2026-12-03T00:00Z"), ("b.test", "job:nightly@2026-12-03T00:00Z")]
    assert len(store.ops.keyed_operations(OpKind.JOB, 0.0)) == 3
    assert store.ops.keyed_operations(OpKind.JOB, store.clock.now() + 60) == []


def test_converging_a_step_marks_it_dealt_with_and_may_fail_it(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    first = store.ops.begin_step(op.id, StepKind.SPAWN, service="web", after_gen=3)
    second = store.ops.begin_step(op.id, StepKind.READY, service="web", after_gen=3)
    store.ops.finish_step(op.id, first, StepState.SUCCEEDED)
    store.ops.converge_step(op.id, first, "stopped gen 3")
    store.ops.converge_step(op.id, second, "never ready", fail_with="gone before ready")
    one, two = store.ops.steps(op.id)
    assert (one.converged, one.state, one.detail) == (True, StepState.SUCCEEDED,
                                                      "stopped gen 3")
    assert (two.converged, two.state, two.error) == (True, StepState.FAILED,
                                                     "gone before ready")
    with pytest.raises(NotFound):
        store.ops.converge_step(op.id, 9, "x", fail_with="no such step")


def test_a_release_attempt_names_each_release_an_operation_started_processes_of(
        store: Store) -> None:
    _instance(store)
    failed = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    store.plan_generation(app="blog", instance="a.test", service="web",
                                      release=2, build_digest=DIGEST, op_id=failed.id,
                                      port=None)
    store.ops.finish_operation(failed, OpState.FAILED, error="not ready")
    restart = store.ops.begin_operation("blog", "a.test", OpKind.RESTART, owner="me")
    store.plan_generation(app="blog", instance="a.test", service="web",
                                      release=1, build_digest=DIGEST, op_id=restart.id,
                                      port=None)
    attempts = store.ops.release_attempts("blog", {OpKind.DEPLOY})
    assert [(a.instance, a.release, a.build_digest, a.op_id, a.state) for a in attempts] == [
        ("a.test", 2, DIGEST, failed.id, OpState.FAILED)]
    assert store.ops.release_attempts("shop", {OpKind.DEPLOY}) == []


def test_events_are_listed_oldest_first_per_app_after_an_id_and_up_to_a_limit(
        store: Store, clock: FakeClock) -> None:
    store.ops.add_event("deploy", "one", app="blog", instance="a.test")
    clock.advance(1)
    store.ops.add_event("deploy", "two", app="blog")
    store.ops.add_event("deploy", "other", app="shop")
    events = store.ops.list_events("blog")
    assert [(e.message, e.instance) for e in events] == [("one", "a.test"), ("two", None)]
    assert events[1].at == events[0].at + 1
    assert [e.message for e in store.ops.list_events()] == ["one", "two", "other"]
    assert [e.message for e in store.ops.list_events(limit=2)] == ["two", "other"]
    assert [e.message for e in store.ops.list_events(after=events[0].id)] == ["two", "other"]


def test_operations_are_counted_by_app_kind_and_state_in_one_read(store: Store) -> None:
    for kind in (OpKind.WAKE, OpKind.WAKE, OpKind.PARK):
        store.ops.begin_operation("shop", "a.test", kind, "me")
    failed = store.ops.begin_operation("blog", "b.test", OpKind.DEPLOY, "me")
    store.ops.finish_operation(failed, OpState.FAILED, "it broke")
    assert store.ops.operation_counts() == [
        OperationCount("blog", OpKind.DEPLOY, OpState.FAILED, 1),
        OperationCount("shop", OpKind.PARK, OpState.RUNNING, 1),
        OperationCount("shop", OpKind.WAKE, OpState.RUNNING, 2)]


def test_succeeded_operations_of_a_kind_are_counted_by_how_long_each_took(
        store: Store, clock: FakeClock) -> None:
    def took(app: str, seconds: float, state: OpState = OpState.SUCCEEDED) -> None:
        op = store.ops.begin_operation(app, f"{app}.test", OpKind.WAKE, "me")
        clock.advance(seconds)
        store.ops.finish_operation(op, state)

    took("shop", 0.25)
    took("shop", 3.0)
    took("shop", 0.5, OpState.FAILED)  # a failed wake is no wake's duration
    took("blog", 1.0)
    store.ops.begin_operation("blog", "blog.test", OpKind.WAKE, "me")  # not finished
    counted = store.ops.duration_counts(OpKind.WAKE, (0.5, 1.0, 5.0))
    assert counted == {"blog": DurationCounts((0, 1, 1), 1, 1.0),
                       "shop": DurationCounts((1, 1, 2), 2, 3.25)}
    assert store.ops.duration_counts(OpKind.PARK, (1.0,)) == {}
