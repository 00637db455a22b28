"""The contract of the intents that begin and end an operation with its durable mark
(keelway/store/intents.py `begin_with`, `finish_with`), on every backend: the mark and
the operation are one write, so no mark is ever without its operation."""

from __future__ import annotations

import pytest

from keelway.journal import OpKind
from keelway.store import NotFound, Store
from keelway.store.lifecycle import OpState, Removal
from tests.store.contract.helpers import _instance, dump


def test_a_mark_and_the_operation_that_carries_it_are_begun_in_one_write(
        store: Store) -> None:
    _instance(store)

    def mark() -> None:
        store.instances.mark_removing("a.test", Removal.PURGE_DATA)

    op = store.begin_with(mark, "blog", "a.test", OpKind.REMOVE_INSTANCE, "me")
    inst = store.instances.get_instance("a.test")
    assert inst is not None and inst.removing == Removal.PURGE_DATA
    assert store.ops.get_operation(op.id) == op and op.state is OpState.RUNNING


def test_an_intent_that_raises_begins_no_operation(store: Store) -> None:
    _instance(store)
    before = dump(store)

    def mark() -> None:
        store.instances.mark_removing("a.test", Removal.KEEP_DATA)
        store.instances.mark_removing("nope.test", Removal.KEEP_DATA)

    with pytest.raises(NotFound):
        store.begin_with(mark, "blog", "a.test", OpKind.REMOVE_INSTANCE, "me")
    assert dump(store) == before


def test_an_operation_ends_with_its_mark_cleared_in_one_write(store: Store) -> None:
    store.apps.create_app("shop")

    def record() -> None:
        store.instances.add_instances("shop", ["a.test", "b.test"], {})

    op = store.begin_with(record, "shop", "a.test", OpKind.ADD_INSTANCES, "me")
    assert [i.host for i in store.instances.adding_instances()] == ["a.test", "b.test"]
    store.finish_with(lambda: store.instances.finish_adding(["a.test", "b.test"]), op,
                      OpState.SUCCEEDED)
    done = store.ops.get_operation(op.id)
    assert done is not None and done.state is OpState.SUCCEEDED
    assert store.instances.adding_instances() == []
