"""The contract of `RolloutStore` (store.rollouts: a release's journaled way across an
app's instances), on every backend."""

from __future__ import annotations

import pytest

from keelway.journal import OpKind
from keelway.store import Conflict, IllegalTransition, NotFound, Store
from keelway.store.lifecycle import RolloutState
from keelway.store.rollouts import Figures, HostFigures, HostState, RolloutCohort
from tests.store.contract.conftest import OpenStore

COHORTS = (RolloutCohort(("a.test",)), RolloutCohort(("b.test", "c.test")),
           RolloutCohort(("p.test",), judged=False))


def test_a_rollout_begins_running_at_its_first_cohort_every_host_pending_in_order(
        store: Store) -> None:
    began = store.rollouts.begin_rollout("shop", 3, 2, OpKind.DEPLOY, COHORTS)
    assert (began.app, began.release, began.previous, began.kind, began.state,
            began.cohort) == ("shop", 3, 2, OpKind.DEPLOY, RolloutState.RUNNING, 0)
    assert began.cohorts == COHORTS and began.cohorts[2].judged is False
    assert [(h.host, h.cohort, h.state) for h in began.hosts] == [
        ("a.test", 0, HostState.PENDING), ("b.test", 1, HostState.PENDING),
        ("c.test", 1, HostState.PENDING), ("p.test", 2, HostState.PENDING)]
    assert store.rollouts.get_rollout(began.id) == began
    assert store.rollouts.latest_rollout("shop") == began
    assert store.rollouts.latest_rollout("other") is None
    assert store.rollouts.get_rollout(began.id + 100) is None
    assert store.rollouts.running_rollouts() == [began]


def test_a_new_rollout_supersedes_every_open_one_of_its_app_and_no_other(
        store: Store) -> None:
    halted = store.rollouts.begin_rollout("shop", 2, 1, OpKind.DEPLOY, COHORTS)
    halted = store.rollouts.move_rollout(halted, RolloutState.HALTED, reason="canary failed")
    elsewhere = store.rollouts.begin_rollout("blog", 5, None, OpKind.CONFIG, COHORTS[:1])
    newer = store.rollouts.begin_rollout("shop", 3, 1, OpKind.CONFIG, COHORTS[:1])
    old = store.rollouts.get_rollout(halted.id)
    assert old is not None and old.state is RolloutState.SUPERSEDED
    assert old.reason == "release 3 superseded it" and old.version == halted.version + 1
    assert store.rollouts.get_rollout(elsewhere.id) == elsewhere
    assert store.rollouts.latest_rollout("shop") == newer
    assert [r.id for r in store.rollouts.running_rollouts()] == [elsewhere.id, newer.id]
    # A superseded rollout never moves again: nothing can resume it.
    with pytest.raises(IllegalTransition):
        store.rollouts.move_rollout(old, RolloutState.RUNNING)


def test_hosts_are_marked_in_one_write_with_their_reason_and_the_version_stays(
        store: Store) -> None:
    began = store.rollouts.begin_rollout("shop", 3, 2, OpKind.DEPLOY, COHORTS)
    store.rollouts.mark_rollout_hosts(began.id, ["b.test", "c.test"], HostState.ROLLING)
    store.rollouts.mark_rollout_hosts(began.id, ["c.test"], HostState.FAILED,
                                      "web did not settle")
    now = store.rollouts.get_rollout(began.id)
    assert now is not None and now.version == began.version
    assert now.in_state(HostState.ROLLING) == ["b.test"]
    failed = now.host("c.test")
    assert failed is not None and (failed.state, failed.reason) == (
        HostState.FAILED, "web did not settle")
    assert now.host("nowhere.test") is None
    with pytest.raises(NotFound):
        store.rollouts.mark_rollout_hosts(began.id + 100, ["a.test"], HostState.ROLLED)
    assert store.rollouts.get_rollout(began.id) == now
    assert store.rollouts.get_rollout(began.id + 100) is None


def test_a_move_swaps_on_the_version_keeps_its_cohort_unless_told_and_keeps_figures(
        store: Store) -> None:
    began = store.rollouts.begin_rollout("shop", 3, 2, OpKind.DEPLOY, COHORTS)
    figures = Figures(0, "failed", 40, 9, "1%", "9 of 40 responses 5xx",
                      (HostFigures("a.test", 40, 9),))
    moved = store.rollouts.move_rollout(began, RolloutState.RUNNING, cohort=1)
    assert (moved.cohort, moved.version) == (1, began.version + 1)
    halted = store.rollouts.move_rollout(moved, RolloutState.HALTED, reason="over budget",
                                         figures=figures)
    assert (halted.state, halted.cohort, halted.reason, halted.figures) == (
        RolloutState.HALTED, 1, "over budget", figures)
    assert store.rollouts.running_rollouts() == []
    with pytest.raises(Conflict):  # the version it read is gone
        store.rollouts.move_rollout(moved, RolloutState.DONE)
    with pytest.raises(IllegalTransition):  # halted: resumed or aborted, never done
        store.rollouts.move_rollout(halted, RolloutState.DONE)
    assert store.rollouts.get_rollout(began.id) == halted  # neither wrote anything
    resumed = store.rollouts.move_rollout(halted, RolloutState.RUNNING)
    assert (resumed.state, resumed.reason, resumed.figures) == (RolloutState.RUNNING, None,
                                                                None)


def test_a_rollout_is_read_again_whole_by_a_store_opened_again(
        open_store: OpenStore) -> None:
    first = open_store()
    began = first.rollouts.begin_rollout("shop", 3, None, OpKind.ROLLBACK, COHORTS,
                                         [("bake", "10s"), ("parallel", "2")])
    assert began.overrides == (("bake", "10s"), ("parallel", "2"))
    first.rollouts.mark_rollout_hosts(began.id, ["a.test"], HostState.ROLLED)
    again = open_store()
    read = again.rollouts.get_rollout(began.id)
    assert read is not None and read.in_state(HostState.ROLLED) == ["a.test"]
    assert read.kind is OpKind.ROLLBACK and read.previous is None
    assert read.overrides == began.overrides and read == began.__class__(
        **{**{f: getattr(began, f) for f in began.__struct_fields__}, "hosts": read.hosts})


def test_rollouts_are_counted_by_app_and_state(store: Store) -> None:
    first = store.rollouts.begin_rollout("shop", 2, 1, OpKind.DEPLOY, COHORTS)
    store.rollouts.begin_rollout("shop", 3, 2, OpKind.DEPLOY, COHORTS)
    store.rollouts.begin_rollout("blog", 1, None, OpKind.DEPLOY, COHORTS)
    assert store.rollouts.get_rollout(first.id).state is RolloutState.SUPERSEDED
    assert store.rollouts.rollout_counts() == [
        ("blog", RolloutState.RUNNING, 1), ("shop", RolloutState.RUNNING, 1),
        ("shop", RolloutState.SUPERSEDED, 1)]
