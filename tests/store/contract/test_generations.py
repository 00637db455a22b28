"""The contract of `GenerationStore` (store.generations: generations as records,
ACTIVE, inhibitions, crash retries), on every backend."""

from __future__ import annotations

import pytest

from keelway.journal import Inhibition
from keelway.store import Conflict, Store
from keelway.store.lifecycle import (
    GenState,
    IllegalTransition,
)
from tests.store.contract.helpers import (
    RETIRING,
    _everything,
    _fresh,
    _gen,
    _running,
)


def test_a_claimed_port_refuses_a_second_generation_and_writes_none(store: Store) -> None:
    _gen(store, port=4000)
    before = _everything(store)
    with pytest.raises(Conflict, match="port 4000"):
        _gen(store, port=4000)
    assert _everything(store) == before


def test_a_stale_generation_loses_its_compare_and_swap_and_writes_nothing(
    store: Store,
) -> None:
    planned = _gen(store)
    running = store.record_spawn(planned, pid=10, start_ticks=20)
    with pytest.raises(Conflict):
        store.record_spawn(planned, pid=11, start_ticks=21)  # a second spawner, too late
    ready = store.generations.set_generation_state(running, GenState.READY)
    with pytest.raises(Conflict):
        store.generations.set_generation_state(running, GenState.STOPPING)  # read before READY
    assert _fresh(store, planned) == ready
    seen = store.local.presence(ready.id)
    assert (seen.pid, seen.start_ticks, ready.state) == (10, 20, GenState.READY)


def test_an_illegal_move_of_a_fresh_generation_is_refused_and_writes_nothing(
    store: Store,
) -> None:
    gen = _gen(store)
    with pytest.raises(IllegalTransition):
        store.generations.set_generation_state(gen,
                                               GenState.READY)  # PLANNED -> READY skips RUNNING
    assert _fresh(store, gen) == gen


def test_active_is_written_only_over_the_row_the_caller_read(store: Store) -> None:
    one, two = _gen(store, port=4000), _gen(store, port=4001)
    first = store.generations.set_active("a.test", "web", one.id, expected=None)
    with pytest.raises(Conflict):
        store.generations.set_active("a.test", "web", two.id, expected=None)  # it exists now
    moved = store.generations.set_active("a.test", "web", two.id, expected=first)
    with pytest.raises(Conflict):
        store.generations.set_active("a.test", "web", one.id, expected=first)  # stale
    assert store.generations.get_active("a.test", "web") == moved
    assert moved.generation_id == two.id and moved.version == first.version + 1


def test_a_generation_is_read_back_and_listed_newest_first_gone_ones_too(
        store: Store) -> None:
    first = _gen(store, port=4000)
    second = _gen(store, service="worker", port=None)
    store.record_gone(first.id, 0)
    assert store.generations.get_generation(first.id) == _fresh(store, first)
    assert store.generations.get_generation(first.id + 1000) is None
    assert [g.id for g in store.generations.recent_generations("a.test")] == [second.id,
                                                                               first.id]
    assert [g.id for g in store.generations.recent_generations("a.test", limit=1)] == [
        second.id]
    assert store.generations.generation_ids("a.test") == {first.id, second.id}
    assert store.generations.generation_ids("nobody.test") == set()
    assert [g.id for g in store.generations.live_generations("a.test")] == [second.id]


def test_a_mark_is_added_once_and_removed_by_its_reason_alone(store: Store) -> None:
    gen = _running(store)
    store.generations.add_inhibition(gen.id, RETIRING, 1)
    store.generations.add_inhibition(gen.id, RETIRING, 2)  # idempotent
    store.generations.add_inhibition(gen.id, Inhibition.REPLACEMENT_PENDING, 1)
    assert sorted(store.generations.inhibitions(gen.id)) == sorted(
        [RETIRING, Inhibition.REPLACEMENT_PENDING])
    store.generations.remove_inhibition(gen.id, RETIRING)
    store.generations.remove_inhibition(gen.id, RETIRING)  # a repeat changes nothing
    assert store.generations.inhibitions(gen.id) == [Inhibition.REPLACEMENT_PENDING]


def test_active_generations_name_web_first_per_instance(store: Store) -> None:
    worker = _gen(store, service="worker", port=None)
    web = _gen(store, port=4000)
    store.generations.set_active("a.test", "worker", worker.id, expected=None)
    store.generations.set_active("a.test", "web", web.id, expected=None)
    assert [g.id for g in store.generations.active_generations()] == [web.id, worker.id]
    assert [(a.service, a.generation_id) for a in store.generations.list_active("a.test")] == [
        ("web", web.id), ("worker", worker.id)]
