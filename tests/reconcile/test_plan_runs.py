"""One-off runs and convergence: a live run's generation is its operation's, never a
stray; a run is never the latest operation; once its control plane is gone (a crash),
a run generation still alive is a stray to remove (invariant 5)."""

from __future__ import annotations

from keelway.journal import OpKind, StepKind
from keelway.reconcile.apply import gather
from keelway.reconcile.plan import Kind, Observed, Pass, plan
from keelway.store import Store
from keelway.store.lifecycle import OpState, StepState

HOST = "one.test"


def _run_generation(store: Store) -> tuple[int, int]:
    """A deploy that succeeded, then a run of one generation in flight: (op id, gen id)."""
    store.apps.ensure_app("hello")
    store.instances.ensure_instance(HOST, "hello")
    deploy = store.ops.begin_operation("hello", HOST, OpKind.DEPLOY, "me")
    store.ops.finish_operation(deploy, OpState.SUCCEEDED)
    run = store.ops.begin_operation("hello", HOST, OpKind.RUN, "me")
    gen = store.plan_generation(app="hello", instance=HOST, service="run", release=1,
                                            build_digest="d" * 64, op_id=run.id, port=None)
    store.record_spawn(gen, 4242, 7)
    store.ops.begin_step(run.id, StepKind.RUN_EXIT, service="run")
    return run.id, gen.id


def test_a_run_is_never_the_operation_convergence_reads(store: Store) -> None:
    run_id, _ = _run_generation(store)
    latest = store.ops.latest_operation(HOST)
    assert latest is not None and latest.kind is OpKind.DEPLOY
    assert [op.id for op in store.ops.unfinished_runs()] == [run_id]


def test_a_live_runs_generation_is_left_to_it_by_every_pass(store: Store) -> None:
    run_id, gen_id = _run_generation(store)
    records = gather(store, HOST, {run_id})
    assert records is not None and records.owned == {gen_id}
    alive = Observed(frozenset({gen_id}), frozenset({gen_id}))
    for mode in Pass:
        assert not [a for a in plan(records, alive, mode) if a.generation == gen_id]


def test_after_a_crash_a_run_generation_still_alive_is_a_stray_to_remove(
        store: Store) -> None:
    _run_id, gen_id = _run_generation(store)
    records = gather(store, HOST, set())  # a new control plane: nothing of it is live
    assert records is not None and records.owned == frozenset()
    actions = plan(records, Observed(frozenset({gen_id}), frozenset()), Pass.BOOT)
    assert [(a.kind, a.generation) for a in actions if a.generation == gen_id] == [
        (Kind.REMOVE_STRAY, gen_id)]


def test_a_fence_is_held_only_while_its_row_says_so(store: Store) -> None:
    store.apps.ensure_app("hello")
    store.instances.ensure_instance(HOST, "hello")
    assert not store.instances.fenced(HOST)
    assert not store.instances.fenced("nowhere.test")


def test_a_finished_run_is_no_longer_unfinished(store: Store) -> None:
    run_id, _ = _run_generation(store)
    op = store.ops.get_operation(run_id)
    assert op is not None
    store.ops.finish_step(run_id, 1, StepState.FAILED, error="interrupted")
    store.ops.finish_operation(op, OpState.FAILED, error="interrupted")
    assert store.ops.unfinished_runs() == []
