"""The import journal on SQLite, with rows written by hand: a row at the host that is not
the import's, and a state word this keelway never wrote (the rest of the journal's
contract is tests/store/contract/test_imports.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.store import Conflict, SqliteStore
from keelway.store.lifecycle import RouteState
from keelway.testing.clock import FakeClock
from keelway.testing.dump import dump

HOST = "a.test"
SEED = "seed-0123456789abcdef"


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    s = SqliteStore(tmp_path / "keelway.db", FakeClock())
    s.apps.ensure_app("shop")
    s.instances.ensure_instance(HOST, "shop")
    s.routes.set_route(HOST, HOST, RouteState.GATED, None, None, expected=None)
    return s


def test_the_route_restore_refuses_a_row_that_is_not_the_import_s(
        store: SqliteStore) -> None:
    store.imports.begin_import(HOST, SEED, env_before={}, sha256="ab")
    store.imports.close_import_gate(HOST, SEED)
    store.db._conn.execute("UPDATE routes SET seed='seed-2222222222222222' WHERE host=?",
                        (HOST,))
    before = dump(store)
    with pytest.raises(Conflict):
        store.imports.restore_import_route(HOST, SEED)
    assert dump(store) == before


def test_an_unknown_state_is_read_back_and_never_moved(store: SqliteStore) -> None:
    store.imports.begin_import(HOST, SEED, env_before={}, sha256="ab")
    store.db._conn.execute("UPDATE seed_imports SET state='later-word'")
    journal = store.imports.get_import(HOST)
    assert journal is not None and journal.known is None
    for intent in (store.imports.open_import_gate, store.imports.close_import_gate,
                   store.imports.restore_import_route, store.imports.fence_import):
        with pytest.raises(Conflict):
            intent(HOST, SEED)
    assert not store.imports.delete_import(HOST, SEED)
