"""The contract of `ImportStore` (store.imports: the import journal's intents, the gate,
the moves, fence generations, the record CAS), on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Conflict, Store
from keelway.store.imports import ImportState, SeedState
from keelway.store.lifecycle import (
    InstanceState,
    RouteState,
)
from tests.store.contract.helpers import (
    dump,
)

HOST = "a.test"
SEED = "seed-0123456789abcdef"


def _gated(store: Store) -> Store:
    """An instance of shop at HOST whose route is gated: where an import begins."""
    store.apps.ensure_app("shop")
    store.instances.ensure_instance(HOST, "shop")
    store.routes.set_route(HOST, HOST, RouteState.GATED, None, None, expected=None)
    return store


def test_begin_import_journals_and_closes_the_gate_in_one_write(store: Store) -> None:
    _gated(store)
    journal = store.imports.begin_import(HOST, SEED, env_before={"K": "v"}, sha256="ab")
    assert (journal.known, journal.fence_gen, journal.record, journal.had_route) == (
        ImportState.IMPORTING, None, f"shop/{HOST}", True)
    assert journal.instance_before is InstanceState.RUNNING
    row = store.imports.row_at(HOST)
    assert row is not None and (row.state, row.seed) == (RouteState.GATED, SEED)
    inst = store.instances.get_instance(HOST)
    assert inst is not None and inst.state is InstanceState.STOPPED
    record = store.imports.seed_record(HOST)
    assert record is not None and (record.seed, record.state) == (SEED, SeedState.IMPORTING)


def test_a_second_import_is_refused_by_the_gate_with_nothing_written(
        store: Store) -> None:
    _gated(store)
    store.imports.begin_import(HOST, SEED, env_before={}, sha256="ab")
    before = dump(store)
    with pytest.raises(Conflict):
        store.imports.begin_import(HOST, "seed-1111111111111111", env_before={}, sha256="cd")
    assert dump(store) == before


def test_fence_generations_are_stored_with_the_bump_and_kept_while_held(
        store: Store) -> None:
    _gated(store)
    store.imports.begin_import(HOST, SEED, env_before={}, sha256="ab")
    first = store.imports.fence_import(HOST, SEED)
    assert first.fence_gen == 1 and store.instances.fenced(HOST)
    assert store.imports.fence_import(HOST, SEED).fence_gen == 1  # held: kept
    store.instances.unfence(HOST, 1)
    assert store.imports.fence_import(HOST, SEED).fence_gen == 2  # lifted by hand: a new one
    closed = store.imports.close_import_gate(HOST, SEED)
    assert closed.known is ImportState.ROLLING_BACK and closed.fence_gen == 3


def test_the_journal_moves_only_along_its_table(store: Store) -> None:
    _gated(store)
    store.imports.begin_import(HOST, SEED, env_before={}, sha256="ab")
    with pytest.raises(Conflict):
        store.imports.restore_import_route(HOST, SEED)  # not rolling back
    with pytest.raises(Conflict):
        store.imports.open_import_gate(HOST, "seed-1111111111111111")  # not this seed
    opened = store.imports.open_import_gate(HOST, SEED)
    assert opened.known is ImportState.SWAPPED
    assert store.imports.open_import_gate(HOST, SEED).version == opened.version  # idempotent
    store.imports.close_import_gate(HOST, SEED)
    with pytest.raises(Conflict):
        store.imports.close_import_gate(HOST, SEED)
    assert not store.imports.delete_import(HOST, SEED)  # only from cleanup-pending
    restored = store.imports.restore_import_route(HOST, SEED)
    assert restored.known is ImportState.CLEANUP_PENDING
    row = store.imports.row_at(HOST)
    assert row is not None and row.seed is None
    inst = store.instances.get_instance(HOST)
    assert inst is not None and inst.state is InstanceState.RUNNING
    assert store.imports.restore_import_route(HOST, SEED).version == restored.version
    assert store.imports.delete_import(HOST, SEED) and store.imports.get_import(HOST) is None


def test_the_record_moves_by_compare_and_swap_on_its_seed(store: Store) -> None:
    _gated(store)
    store.imports.begin_import(HOST, SEED, env_before={}, sha256="ab")
    store.imports.close_import_gate(HOST, SEED)
    aborted = frozenset({SeedState.ABORTED})
    assert not store.imports.cas_seed_record(f"shop/{HOST}", "seed-1111111111111111", aborted,
                                     SeedState.ROLLED_BACK)
    assert not store.imports.cas_seed_record(f"other/{HOST}", SEED, aborted, SeedState.ROLLED_BACK)
    assert store.imports.cas_seed_record(f"shop/{HOST}", SEED, aborted, SeedState.ROLLED_BACK)
    assert not store.imports.cas_seed_record(f"shop/{HOST}", SEED, aborted, SeedState.ROLLED_BACK)
    record = store.imports.seed_record(HOST)
    assert record is not None and record.state is SeedState.ROLLED_BACK


def test_imports_are_listed_per_instance_and_read_back(store: Store) -> None:
    _gated(store)
    assert store.imports.list_imports() == [] and store.imports.get_import(HOST) is None
    journal = store.imports.begin_import(HOST, SEED, env_before={"K": None}, sha256="ab")
    assert store.imports.list_imports() == [journal]
    assert store.imports.get_import(HOST) == journal and journal.env_before == {"K": None}
    assert store.imports.seed_record("nobody.test") is None
    assert store.imports.row_at("nobody.test") is None
