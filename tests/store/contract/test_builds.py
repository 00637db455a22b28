"""The contract of `BuildStore` (store.builds: builds and releases), on every backend."""

from __future__ import annotations

from keelway.journal import REPLICA, Cause
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


def _digest(n: int) -> str:
    return f"{n:064x}"


def _releases(store: Store, count: int) -> None:
    store.apps.ensure_app("blog")
    store.instances.ensure_instance("a.test", "blog")
    for n in range(1, count + 1):
        store.builds.record_build("blog", _digest(n), f"/builds/blog/{_digest(n)}")
        store.builds.create_release("blog", _digest(n), {}, f"v{n}")


def test_only_the_newest_releases_pin_their_builds_with_keep(store: Store) -> None:
    _releases(store, 5)
    assert store.builds.pinned_builds() == {("blog", _digest(n)) for n in range(1, 6)}
    assert store.builds.pinned_builds({"blog": 2}) == {("blog", _digest(4)), ("blog", _digest(5))}
    # an app the caller gave no keep for keeps every release pinned
    assert store.builds.pinned_builds({"shop": 1}) == store.builds.pinned_builds()


def test_the_active_and_the_last_good_builds_stay_pinned_beyond_keep(store: Store) -> None:
    _releases(store, 6)
    store.builds.mark_build_good("blog", _digest(1))
    store.builds.mark_build_good("blog", _digest(2))
    store.builds.mark_build_good("blog", _digest(3))
    gen = store.plan_generation(app="blog", instance="a.test", service="web", release=4,
                                build_digest=_digest(4), op_id=None, port=4100)
    store.generations.set_active("a.test", "web", gen.id, expected=None)
    store.record_gone(gen.id, None)  # parked: ACTIVE still names what its wake starts
    assert store.builds.pinned_builds({"blog": 1}) == {
        ("blog", _digest(6)),  # the newest release
        ("blog", _digest(4)),  # ACTIVE
        ("blog", _digest(3)), ("blog", _digest(2)),  # the two newest good ones
    }


def test_a_release_deferred_to_a_parked_instance_stays_pinned(store: Store) -> None:
    _releases(store, 3)
    inst = store.instances.get_instance("a.test")
    assert inst is not None
    store.defer_release("a.test", schedule_rev=inst.schedule_rev, number=1,
                        cause=Cause.RELEASE, release=None)
    assert store.builds.pinned_builds({"blog": 1}) == {("blog", _digest(3)), ("blog", _digest(1))}


def test_a_replicator_running_since_the_first_release_pins_no_build(store: Store) -> None:
    _releases(store, 3)
    store.plan_generation(app="blog", instance="a.test", service=REPLICA, release=1,
                          build_digest=_digest(1), op_id=None, port=None)
    assert store.builds.pinned_builds({"blog": 1}) == {("blog", _digest(3))}


def test_a_build_is_marked_good_listed_per_app_and_forgotten(store: Store) -> None:
    store.apps.ensure_app("blog")
    store.apps.ensure_app("shop")
    one = store.builds.record_build("blog", DIGEST, "/b/1", source={"git": "abc"})
    store.builds.record_build("shop", "e" * 64, "/b/2")
    assert not one.good and one.source == {"git": "abc"}
    store.builds.mark_build_good("blog", DIGEST)
    (good,) = store.builds.list_builds("blog")
    assert good.good and good.digest == DIGEST
    assert [b.app for b in store.builds.list_builds()] == ["blog", "shop"]
    store.builds.forget_build("blog", DIGEST)
    assert store.builds.list_builds("blog") == [] and len(store.builds.list_builds()) == 1
