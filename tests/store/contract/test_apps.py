"""The contract of `AppStore` (store.apps), on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Conflict, NotFound, Store
from keelway.store.lifecycle import (
    InstanceState,
    Removal,
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


def test_creating_an_app_twice_is_a_conflict(store: Store) -> None:
    store.apps.create_app("shop")
    with pytest.raises(Conflict):
        store.apps.create_app("shop")


def test_an_app_is_forgotten_once_it_has_no_instance_and_its_name_reused(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    store.builds.record_build("shop", "d" * 64, "/builds/shop/d")
    store.builds.create_release("shop", "d" * 64, {"A": "1"}, "Deploy")
    store.apps.mark_destroying("shop", Removal.KEEP_DATA)
    assert [a.name for a in store.apps.destroying_apps()] == ["shop"]
    with pytest.raises(NotFound):  # no new instance of an app being destroyed
        store.instances.add_instances("shop", ["b.test"], {})
    with pytest.raises(Conflict, match="still has 1 instances"):
        store.apps.forget_app("shop")
    store.instances.forget_instance("a.test")
    store.apps.forget_app("shop")
    assert store.apps.get_app("shop") is None and store.builds.list_releases("shop") == []
    assert store.builds.list_builds("shop") == []
    store.apps.create_app("shop")
    assert store.builds.next_release_number("shop") == 1


def test_apps_are_listed_by_name(store: Store) -> None:
    assert store.apps.list_apps() == []
    store.apps.ensure_app("shop")
    store.apps.create_app("blog")
    assert [a.name for a in store.apps.list_apps()] == ["blog", "shop"]
    assert store.apps.get_app("nobody") is None


def test_marking_an_unknown_app_destroying_is_not_found_and_writes_nothing(
        store: Store) -> None:
    before = dump(store)
    with pytest.raises(NotFound, match="nobody"):
        store.apps.mark_destroying("nobody", Removal.PURGE_DATA)
    assert dump(store) == before and store.apps.destroying_apps() == []
