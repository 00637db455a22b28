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
