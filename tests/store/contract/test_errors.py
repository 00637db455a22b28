"""Errors are the store's, on every backend: what a driver would refuse (a foreign key, a
unique index) is a `StoreError` of a kind (`NotFound`, `Conflict`) that names what was
written, and the write changes nothing."""

from __future__ import annotations

import pytest

from keelway.journal import OpKind, StepKind
from keelway.store import Conflict, NotFound, StaleOwner, StaleSchedule, Store, StoreError
from keelway.store.hosts import HostTaken
from keelway.store.lifecycle import (
    IllegalTransition,
)
from tests.store.contract.helpers import (
    RETIRING,
    _everything,
    _gen,
    _instance,
)


def test_a_write_naming_an_unknown_generation_is_not_found_and_writes_nothing(
        store: Store) -> None:
    _instance(store)
    before = _everything(store)
    with pytest.raises(NotFound, match=r"set active of web on a\.test: no generation 9"):
        store.generations.set_active("a.test", "web", 9, expected=None)
    with pytest.raises(NotFound, match="no generation 9"):
        store.generations.add_inhibition(9, RETIRING, None)
    assert _everything(store) == before


def test_a_step_of_an_unknown_operation_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="no operation 404"):
        store.ops.begin_step(404, StepKind.SPAWN)
    assert store.ops.steps(404) == []


def test_a_taken_name_is_a_conflict_whatever_index_refuses_it(store: Store) -> None:
    _gen(store, port=4000)
    store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k")
    before = _everything(store)
    with pytest.raises(Conflict, match="port 4000"):
        _gen(store, port=4000)
    with pytest.raises(Conflict, match="already has key"):
        store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k")
    with pytest.raises(Conflict):
        store.apps.create_app("blog")
    assert _everything(store) == before


def test_every_kind_of_error_is_a_store_error() -> None:
    for kind in (NotFound, Conflict, StaleSchedule, HostTaken, IllegalTransition, StaleOwner):
        assert issubclass(kind, StoreError), kind
    assert issubclass(StaleSchedule, Conflict) and issubclass(HostTaken, Conflict)
