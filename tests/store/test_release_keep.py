"""Old releases can go: beyond each app's `[releases] keep`, a release no longer pins
its build, unless ACTIVE names it, it is the last good one, or a parked instance waits
for it."""

from __future__ import annotations

from keelway.journal import REPLICA, Cause
from keelway.store import Store


def _digest(n: int) -> str:
    return f"{n:064x}"


def _releases(store: Store, count: int) -> None:
    store.ensure_app("blog")
    store.ensure_instance("a.test", "blog")
    for n in range(1, count + 1):
        store.record_build("blog", _digest(n), f"/builds/blog/{_digest(n)}")
        store.create_release("blog", _digest(n), {}, f"v{n}")


def test_only_the_newest_releases_pin_their_builds_with_keep(store: Store) -> None:
    _releases(store, 5)
    assert store.pinned_builds() == {("blog", _digest(n)) for n in range(1, 6)}
    assert store.pinned_builds({"blog": 2}) == {("blog", _digest(4)), ("blog", _digest(5))}
    # an app the caller gave no keep for keeps every release pinned
    assert store.pinned_builds({"shop": 1}) == store.pinned_builds()


def test_the_active_and_the_last_good_builds_stay_pinned_beyond_keep(store: Store) -> None:
    _releases(store, 6)
    store.mark_build_good("blog", _digest(1))
    store.mark_build_good("blog", _digest(2))
    store.mark_build_good("blog", _digest(3))
    gen = store.plan_generation(app="blog", instance="a.test", service="web", release=4,
                                build_digest=_digest(4), op_id=None, port=4100)
    store.set_active("a.test", "web", gen.id, expected=None)
    store.record_gone(gen.id, None)  # parked: ACTIVE still names what its wake starts
    assert store.pinned_builds({"blog": 1}) == {
        ("blog", _digest(6)),  # the newest release
        ("blog", _digest(4)),  # ACTIVE
        ("blog", _digest(3)), ("blog", _digest(2)),  # the two newest good ones
    }


def test_a_release_deferred_to_a_parked_instance_stays_pinned(store: Store) -> None:
    _releases(store, 3)
    inst = store.get_instance("a.test")
    assert inst is not None
    store.defer_release("a.test", schedule_rev=inst.schedule_rev, number=1,
                        cause=Cause.RELEASE, release=None)
    assert store.pinned_builds({"blog": 1}) == {("blog", _digest(3)), ("blog", _digest(1))}


def test_a_replicator_running_since_the_first_release_pins_no_build(store: Store) -> None:
    _releases(store, 3)
    store.plan_generation(app="blog", instance="a.test", service=REPLICA, release=1,
                          build_digest=_digest(1), op_id=None, port=None)
    assert store.pinned_builds({"blog": 1}) == {("blog", _digest(3))}
