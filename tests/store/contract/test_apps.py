"""The contract of `AppStore` (store.apps), on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Conflict, Store
from keelway.store.lifecycle import (
    InstanceState,
)
from tests.store.contract.helpers import (
    _instance,
    dump,
)


def test_ensuring_an_app_or_an_instance_twice_changes_nothing(store: Store) -> None:
    _instance(store)
    before = dump(store)
    assert store.apps.ensure_app("blog") == store.apps.get_app("blog")
    assert store.instances.ensure_instance("a.test",
                                           "blog") == store.instances.get_instance("a.test")
    assert dump(store) == before


def test_a_stale_app_or_instance_loses_its_compare_and_swap_and_writes_nothing(
    store: Store,
) -> None:
    _instance(store)
    app, inst = store.apps.get_app("blog"), store.instances.get_instance("a.test")
    assert app is not None and inst is not None
    store.apps.set_app_config(app, {"A": "1"})
    store.instances.set_instance_state(inst, InstanceState.STOPPED)
    before = dump(store)
    with pytest.raises(Conflict):
        store.apps.set_app_config(app, {"A": "2"})
    with pytest.raises(Conflict):
        store.instances.set_instance_state(inst, InstanceState.DOWN, "why")
    assert dump(store) == before
