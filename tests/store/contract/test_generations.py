"""The contract of `GenerationStore` (store.generations: generations as records,
ACTIVE, inhibitions, crash retries), on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Conflict, Store
from keelway.store.lifecycle import (
    GenState,
    IllegalTransition,
)
from tests.store.contract.helpers import (
    _everything,
    _fresh,
    _gen,
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
    running = store.local.record_spawn(planned, pid=10, start_ticks=20)
    with pytest.raises(Conflict):
        store.local.record_spawn(planned, pid=11, start_ticks=21)  # a second spawner, too late
    ready = store.generations.set_generation_state(running, GenState.READY)
    with pytest.raises(Conflict):
        store.generations.set_generation_state(running, GenState.STOPPING)  # read before READY
    assert _fresh(store, planned) == ready
    assert (ready.pid, ready.start_ticks, ready.state) == (10, 20, GenState.READY)


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
