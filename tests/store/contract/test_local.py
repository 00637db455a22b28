"""The contract of `BoxLocalStore` (store.local: what only this box observes of a
generation: its pid and start ticks, its death, the ports claimed), on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Store
from keelway.store.lifecycle import (
    GenState,
    IllegalTransition,
)
from tests.store.contract.helpers import (
    RETIRING,
    _gen,
    _running,
)


def test_a_generation_recorded_gone_frees_its_claim_and_marks_and_stays_gone(
    store: Store,
) -> None:
    gen = _running(store)
    store.generations.add_inhibition(gen.id, RETIRING, None)
    store.generations.add_inhibition(gen.id, RETIRING, None)  # idempotent
    assert store.generations.inhibitions(gen.id) == [RETIRING]
    gone = store.local.record_gone(gen.id, exit_code=3)
    assert store.local.claimed_ports() == set() and store.generations.inhibitions(gen.id) == []
    assert store.local.record_gone(gen.id, exit_code=9) == gone  # a repeat changes nothing
    with pytest.raises(IllegalTransition):
        store.generations.set_generation_state(gone, GenState.RUNNING)
    assert store.generations.live_generations() == []
    _gen(store, port=4000)  # the port is free again
