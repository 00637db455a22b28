"""The contract of `BoxLocalStore` (store.local: what only this box observes of a
generation, its `Presence`: the port claimed for it, its leader's pid and start ticks),
and of the intents that write it with the generation's record, on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Conflict, Store
from keelway.store.lifecycle import (
    GenState,
    IllegalTransition,
)
from keelway.store.records import Generation, Presence
from tests.store.contract.helpers import (
    DIGEST,
    RETIRING,
    _everything,
    _gen,
    _instance,
    _running,
)


def _record(store: Store, service: str = "web") -> Generation:
    """The shared record alone, with no presence: what a fleet's other box would see."""
    _instance(store)
    return store.generations.plan_generation(app="blog", instance="a.test", service=service,
                                             release=1, build_digest=DIGEST, op_id=None)


def test_a_generation_recorded_gone_frees_its_claim_and_marks_and_stays_gone(
    store: Store,
) -> None:
    gen = _running(store)
    store.generations.add_inhibition(gen.id, RETIRING, None)
    store.generations.add_inhibition(gen.id, RETIRING, None)  # idempotent
    assert store.generations.inhibitions(gen.id) == [RETIRING]
    gone = store.record_gone(gen.id, exit_code=3)
    assert store.local.claimed_ports() == set() and store.generations.inhibitions(gen.id) == []
    assert store.record_gone(gen.id, exit_code=9) == gone  # a repeat changes nothing
    with pytest.raises(IllegalTransition):
        store.generations.set_generation_state(gone, GenState.RUNNING)
    assert store.generations.live_generations() == []
    _gen(store, port=4000)  # the port is free again
    # What was observed of it stays: its port and its leader, never the claim.
    assert store.local.presence(gen.id) == Presence(gen.id, 4000, 100 + gen.id, 7)


def test_a_presence_holds_its_port_until_freed_and_one_claim_refuses_another(
    store: Store,
) -> None:
    gen, other = _record(store), _record(store)
    assert store.local.add_presence(gen.id, 4000) == Presence(gen.id, port=4000)
    assert store.local.claimed_ports() == {4000}
    assert store.local.port_claimed(4000) and not store.local.port_claimed(4001)
    before = _everything(store)
    with pytest.raises(Conflict, match="port 4000"):
        store.local.add_presence(other.id, 4000)
    with pytest.raises(Conflict):
        store.local.add_presence(gen.id, 4001)  # one presence per generation
    assert _everything(store) == before
    store.local.free_port(gen.id)
    store.local.free_port(gen.id)  # idempotent
    assert store.local.claimed_ports() == set() and not store.local.port_claimed(4000)
    assert store.local.presence(gen.id).port == 4000  # the port it had stays recorded
    assert store.local.add_presence(other.id, 4000).port == 4000


def test_a_spawn_records_its_leader_and_a_bulk_read_answers_every_id_asked(
    store: Store,
) -> None:
    web, worker = _gen(store, port=4000), _gen(store, service="worker", port=None)
    assert store.local.presence(web.id) == Presence(web.id, port=4000)
    seen = store.local.record_process(web.id, pid=10, start_ticks=20)
    assert seen == Presence(web.id, 4000, 10, 20) and seen.leader == (10, 20)
    found = store.local.presences([worker.id, 999, web.id, worker.id])
    assert found == {web.id: seen, worker.id: Presence(worker.id), 999: Presence(999)}
    assert list(found) == sorted(found) and store.local.presences([]) == {}
    # Nothing observed of a generation this box never ran: no leader to look for.
    assert store.local.presence(999).leader is None


def test_a_generation_record_carries_no_box_local_fact(store: Store) -> None:
    _instance(store)
    gen = store.generations.plan_generation(app="blog", instance="a.test", service="web",
                                            release=1, build_digest=DIGEST, op_id=None)
    assert gen.state is GenState.PLANNED
    assert not {"pid", "start_ticks", "port"} & set(Generation.__struct_fields__)
    assert store.local.presence(gen.id) == Presence(gen.id)  # the intent writes that
    store.generations.add_inhibition(gen.id, RETIRING, None)
    gone = store.generations.record_exit(gen.id, 3)
    assert (gone.state, gone.exit_code, gone.exited_at is not None) == (GenState.GONE, 3, True)
    assert store.generations.inhibitions(gen.id) == []
    assert store.generations.record_exit(gen.id, 9) == gone  # a fact: a repeat is a no-op


def test_planning_on_a_claimed_port_writes_neither_the_record_nor_its_presence(
    store: Store,
) -> None:
    _gen(store, port=4000)
    before = _everything(store)
    with pytest.raises(Conflict, match="port 4000"):
        store.plan_generation(app="blog", instance="a.test", service="web", release=1,
                              build_digest=DIGEST, op_id=None, port=4000)
    assert _everything(store) == before


def test_a_spawn_that_loses_its_compare_and_swap_records_no_leader(store: Store) -> None:
    planned = _gen(store)
    store.record_spawn(planned, pid=10, start_ticks=20)
    with pytest.raises(Conflict):
        store.record_spawn(planned, pid=11, start_ticks=21)
    assert store.local.presence(planned.id).leader == (10, 20)
