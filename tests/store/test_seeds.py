"""The import journal's intents: the gate, the moves, fence generations, the record CAS."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.store import Conflict, SqliteStore
from keelway.store.imports import ImportState, SeedState
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.testing.clock import FakeClock
from keelway.testing.dump import dump

HOST = "a.test"
SEED = "seed-0123456789abcdef"


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    s = SqliteStore(tmp_path / "keelway.db", FakeClock())
    s.ensure_app("shop")
    s.ensure_instance(HOST, "shop")
    s.set_route(HOST, HOST, RouteState.GATED, None, None, expected=None)
    return s


def test_begin_import_journals_and_closes_the_gate_in_one_write(store: SqliteStore) -> None:
    journal = store.begin_import(HOST, SEED, env_before={"K": "v"}, sha256="ab")
    assert (journal.known, journal.fence_gen, journal.record, journal.had_route) == (
        ImportState.IMPORTING, None, f"shop/{HOST}", True)
    assert journal.instance_before is InstanceState.RUNNING
    row = store.row_at(HOST)
    assert row is not None and (row.state, row.seed) == (RouteState.GATED, SEED)
    inst = store.get_instance(HOST)
    assert inst is not None and inst.state is InstanceState.STOPPED
    record = store.seed_record(HOST)
    assert record is not None and (record.seed, record.state) == (SEED, SeedState.IMPORTING)


def test_a_second_import_is_refused_by_the_gate_with_nothing_written(
        store: SqliteStore) -> None:
    store.begin_import(HOST, SEED, env_before={}, sha256="ab")
    before = dump(store)
    with pytest.raises(Conflict):
        store.begin_import(HOST, "seed-1111111111111111", env_before={}, sha256="cd")
    assert dump(store) == before


def test_fence_generations_are_stored_with_the_bump_and_kept_while_held(
        store: SqliteStore) -> None:
    store.begin_import(HOST, SEED, env_before={}, sha256="ab")
    first = store.fence_import(HOST, SEED)
    assert first.fence_gen == 1 and store.fenced(HOST)
    assert store.fence_import(HOST, SEED).fence_gen == 1  # held: kept
    store.unfence(HOST, 1)
    assert store.fence_import(HOST, SEED).fence_gen == 2  # lifted by hand: a new one
    closed = store.close_import_gate(HOST, SEED)
    assert closed.known is ImportState.ROLLING_BACK and closed.fence_gen == 3


def test_the_journal_moves_only_along_its_table(store: SqliteStore) -> None:
    store.begin_import(HOST, SEED, env_before={}, sha256="ab")
    with pytest.raises(Conflict):
        store.restore_import_route(HOST, SEED)  # not rolling back
    with pytest.raises(Conflict):
        store.open_import_gate(HOST, "seed-1111111111111111")  # not this seed
    opened = store.open_import_gate(HOST, SEED)
    assert opened.known is ImportState.SWAPPED
    assert store.open_import_gate(HOST, SEED).version == opened.version  # idempotent
    store.close_import_gate(HOST, SEED)
    with pytest.raises(Conflict):
        store.close_import_gate(HOST, SEED)
    assert not store.delete_import(HOST, SEED)  # only from cleanup-pending
    restored = store.restore_import_route(HOST, SEED)
    assert restored.known is ImportState.CLEANUP_PENDING
    row = store.row_at(HOST)
    assert row is not None and row.seed is None
    inst = store.get_instance(HOST)
    assert inst is not None and inst.state is InstanceState.RUNNING
    assert store.restore_import_route(HOST, SEED).version == restored.version
    assert store.delete_import(HOST, SEED) and store.get_import(HOST) is None


def test_the_route_restore_refuses_a_row_that_is_not_the_import_s(
        store: SqliteStore) -> None:
    store.begin_import(HOST, SEED, env_before={}, sha256="ab")
    store.close_import_gate(HOST, SEED)
    store.db._conn.execute("UPDATE routes SET seed='seed-2222222222222222' WHERE host=?",
                        (HOST,))
    before = dump(store)
    with pytest.raises(Conflict):
        store.restore_import_route(HOST, SEED)
    assert dump(store) == before


def test_the_record_moves_by_compare_and_swap_on_its_seed(store: SqliteStore) -> None:
    store.begin_import(HOST, SEED, env_before={}, sha256="ab")
    store.close_import_gate(HOST, SEED)
    aborted = frozenset({SeedState.ABORTED})
    assert not store.cas_seed_record(f"shop/{HOST}", "seed-1111111111111111", aborted,
                                     SeedState.ROLLED_BACK)
    assert not store.cas_seed_record(f"other/{HOST}", SEED, aborted, SeedState.ROLLED_BACK)
    assert store.cas_seed_record(f"shop/{HOST}", SEED, aborted, SeedState.ROLLED_BACK)
    assert not store.cas_seed_record(f"shop/{HOST}", SEED, aborted, SeedState.ROLLED_BACK)
    record = store.seed_record(HOST)
    assert record is not None and record.state is SeedState.ROLLED_BACK


def test_an_unknown_state_is_read_back_and_never_moved(store: SqliteStore) -> None:
    store.begin_import(HOST, SEED, env_before={}, sha256="ab")
    store.db._conn.execute("UPDATE seed_imports SET state='later-word'")
    journal = store.get_import(HOST)
    assert journal is not None and journal.known is None
    for intent in (store.open_import_gate, store.close_import_gate,
                   store.restore_import_route, store.fence_import):
        with pytest.raises(Conflict):
            intent(HOST, SEED)
    assert not store.delete_import(HOST, SEED)
