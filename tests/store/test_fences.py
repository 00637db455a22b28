"""Fences and the park intent, on every store (the contract suite's backends)."""

from __future__ import annotations

import pytest

from keelway.store import NotFound, Store
from keelway.store.lifecycle import IllegalTransition, InstanceState, RouteState, check
from tests.store.test_contract import _everything, _instance, open_store, store

__all__ = ["open_store", "store"]  # the contract suite's fixtures, run here too


def test_a_fence_generation_only_grows_and_each_fence_holds(store: Store) -> None:
    _instance(store)
    assert store.get_fence("a.test") is None and not store.fenced("a.test")
    first = store.fence("a.test", "seed import")
    second = store.fence("a.test", None)
    assert (first.generation, second.generation) == (1, 2)
    assert second.held and store.fenced("a.test")


def test_lifting_the_held_generation_unfences(store: Store) -> None:
    _instance(store)
    fence = store.fence("a.test", "by hand")
    now, lifted = store.unfence("a.test", fence.generation)
    assert lifted and now is not None and not now.held and not store.fenced("a.test")
    assert now.generation == fence.generation  # lifting never moves the generation


def test_a_stale_unfence_changes_nothing(store: Store) -> None:
    _instance(store)
    old = store.fence("a.test", "first holder")
    store.fence("a.test", "second holder")
    before = _everything(store)
    now, lifted = store.unfence("a.test", old.generation)
    assert not lifted and now is not None and now.held and now.generation == 2
    assert _everything(store) == before


def test_unfencing_twice_or_an_unfenced_instance_changes_nothing(store: Store) -> None:
    _instance(store)
    assert store.unfence("a.test", 1) == (None, False)
    fence = store.fence("a.test", None)
    store.unfence("a.test", fence.generation)
    before = _everything(store)
    assert store.unfence("a.test", fence.generation)[1] is False
    assert _everything(store) == before


def test_fencing_an_instance_that_does_not_exist_is_refused(store: Store) -> None:
    with pytest.raises(NotFound):
        store.fence("nobody.test", None)
    assert store.get_fence("nobody.test") is None


def test_parking_writes_the_instance_and_its_route_in_one_write(store: Store) -> None:
    _instance(store)
    store.set_route("a.test", "a.test", RouteState.SERVING, 4000, 9, expected=None)
    inst = store.get_instance("a.test")
    assert inst is not None
    parked = store.park(inst)
    route = store.get_route("a.test")
    assert parked.state is InstanceState.PARKED
    assert route is not None and (route.state, route.port, route.generation_id) == (
        RouteState.PARKED, None, None)


def test_parking_a_stopped_instance_is_refused_and_writes_nothing(store: Store) -> None:
    _instance(store)
    store.set_route("a.test", "a.test", RouteState.GATED, None, None, expected=None)
    inst = store.get_instance("a.test")
    assert inst is not None
    stopped = store.set_instance_state(inst, InstanceState.STOPPED)
    before = _everything(store)
    with pytest.raises(IllegalTransition):
        store.park(stopped)
    assert _everything(store) == before


def test_a_parked_route_is_served_gated_or_held_again_never_drained() -> None:
    for state in (RouteState.SERVING, RouteState.GATED, RouteState.HOLDING):
        check(RouteState.PARKED, state)
    with pytest.raises(IllegalTransition):
        check(RouteState.PARKED, RouteState.DRAINING)


def test_a_parked_instance_wakes_stops_or_goes_down_and_only_a_running_one_parks() -> None:
    for state in (InstanceState.RUNNING, InstanceState.STOPPED, InstanceState.DOWN):
        check(InstanceState.PARKED, state)
    check(InstanceState.RUNNING, InstanceState.PARKED)
    for state in (InstanceState.STOPPED, InstanceState.DOWN):
        with pytest.raises(IllegalTransition):
            check(state, InstanceState.PARKED)
