"""The contract of `BuildStore` (store.builds: builds and releases), on every backend."""

from __future__ import annotations

from keelway.store import Store
from tests.store.contract.helpers import (
    DIGEST,
)


def test_recording_a_build_twice_keeps_the_first_record(store: Store) -> None:
    first = store.builds.record_build("blog", DIGEST, "/b/1")
    assert store.builds.record_build("blog", DIGEST, "/b/2") == first
    assert store.builds.list_builds("blog") == [first]


def test_release_numbers_grow_per_app_and_are_listed_newest_first(store: Store) -> None:
    store.apps.ensure_app("blog")
    store.apps.ensure_app("shop")
    assert store.builds.next_release_number("blog") == 1
    store.builds.create_release("blog", DIGEST, {}, "one")
    store.builds.create_release("blog", DIGEST, {"A": "1"}, "two")
    store.builds.create_release("shop", DIGEST, {}, "one")
    assert [r.number for r in store.builds.list_releases("blog")] == [2, 1]
    assert store.builds.next_release_number("blog") == 3
    got = store.builds.get_release("blog", 2)
    assert got is not None and got.config == {"A": "1"}
