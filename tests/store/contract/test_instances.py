"""The contract of `InstanceStore` (store.instances: instances, domains, fences,
identity numbers, the bulk view), on every backend."""

from __future__ import annotations

import pytest

from keelway.journal import OpKind, StepKind
from keelway.store import NotFound, Store
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import (
    OpState,
    RouteState,
)
from tests.store.contract.conftest import OpenStore
from tests.store.contract.helpers import (
    DIGEST,
    RETIRING,
    _everything,
    _instance,
)


def test_the_schedule_revision_only_grows_and_names_an_instance(store: Store) -> None:
    _instance(store)
    first = store.instances.bump_schedule("a.test")
    assert store.instances.bump_schedule("a.test") == first + 1
    with pytest.raises(NotFound):
        store.instances.bump_schedule("nobody.test")


def test_instance_views_read_in_bulk_what_each_instance_reads_alone(store: Store) -> None:
    store.apps.ensure_app("blog")
    for host in ("a.test", "b.test", "c.test"):
        store.instances.ensure_instance(host, "blog")
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    older = store.ops.begin_operation("blog", "b.test", OpKind.DEPLOY, owner="me")
    store.ops.finish_operation(older, OpState.SUCCEEDED)
    newer = store.ops.begin_operation("blog", "b.test", OpKind.RESTART, owner="me")
    web = store.generations.plan_generation(app="blog", instance="a.test", service="web", release=1,
                                build_digest=DIGEST, op_id=op.id, port=4100)
    worker = store.generations.plan_generation(app="blog", instance="b.test", service="worker",
                                   release=1, build_digest=DIGEST, op_id=newer.id, port=None)
    store.ops.begin_step(op.id, StepKind.SPAWN, service="web", after_gen=web.id)
    store.ops.begin_step(newer.id, StepKind.STOP, service="worker", before_gen=worker.id)
    store.ops.begin_step(newer.id, StepKind.SPAWN, service="worker", after_gen=worker.id)
    store.generations.add_inhibition(worker.id, RETIRING, newer.id)
    store.generations.set_active("b.test", "worker", worker.id, expected=None)
    store.routes.set_route("a.test", "a.test", RouteState.HOLDING, 4100, web.id, expected=None)

    views = {v.instance.host: v for v in store.instances.instance_views()}
    assert sorted(views) == ["a.test", "b.test", "c.test"]
    for host, view in views.items():
        assert view.instance == store.instances.get_instance(host)
        assert view.latest == store.ops.latest_operation(host)
        assert view.active == {a.service: a.generation_id for a in store.generations.list_active(
            host)}
        assert view.live == store.generations.live_generations(host)
        assert view.inhibitions == {g.id: frozenset(store.generations.inhibitions(g.id))
                                    for g in store.generations.live_generations(host)}
        assert view.route == store.routes.get_route(host)
    latest_b = views["b.test"].latest
    assert latest_b is not None and latest_b.id == newer.id and len(latest_b.steps) == 2
    assert views["c.test"].latest is None and views["c.test"].route is None
    assert [g.id for g in store.generations.active_generations()] == [worker.id]


def test_an_identity_number_is_allocated_once_per_name_and_never_to_another(
        open_store: OpenStore) -> None:
    store = open_store()
    a = store.instances.identity_number(IdSpace.UID, "instance:a.test")
    b = store.instances.identity_number(IdSpace.UID, "instance:b.test")
    assert a != b
    assert store.instances.identity_number(IdSpace.UID, "instance:a.test") == a
    # the spaces are apart: an app's group number says nothing of any uid
    assert store.instances.identity_number(IdSpace.GID, "app:blog") == 0
    assert store.instances.identity_number(IdSpace.UID, "build:blog") not in {a, b}
    assert open_store().instances.identity_number(IdSpace.UID, "instance:a.test") == a  # reopened


def test_a_fence_generation_only_grows_and_each_fence_holds(store: Store) -> None:
    _instance(store)
    assert store.instances.get_fence("a.test") is None and not store.instances.fenced("a.test")
    first = store.instances.fence("a.test", "seed import")
    second = store.instances.fence("a.test", None)
    assert (first.generation, second.generation) == (1, 2)
    assert second.held and store.instances.fenced("a.test")


def test_lifting_the_held_generation_unfences(store: Store) -> None:
    _instance(store)
    fence = store.instances.fence("a.test", "by hand")
    now, lifted = store.instances.unfence("a.test", fence.generation)
    assert lifted and now is not None and not now.held and not store.instances.fenced("a.test")
    assert now.generation == fence.generation  # lifting never moves the generation


def test_a_stale_unfence_changes_nothing(store: Store) -> None:
    _instance(store)
    old = store.instances.fence("a.test", "first holder")
    store.instances.fence("a.test", "second holder")
    before = _everything(store)
    now, lifted = store.instances.unfence("a.test", old.generation)
    assert not lifted and now is not None and now.held and now.generation == 2
    assert _everything(store) == before


def test_unfencing_twice_or_an_unfenced_instance_changes_nothing(store: Store) -> None:
    _instance(store)
    assert store.instances.unfence("a.test", 1) == (None, False)
    fence = store.instances.fence("a.test", None)
    store.instances.unfence("a.test", fence.generation)
    before = _everything(store)
    assert store.instances.unfence("a.test", fence.generation)[1] is False
    assert _everything(store) == before


def test_fencing_an_instance_that_does_not_exist_is_refused(store: Store) -> None:
    with pytest.raises(NotFound):
        store.instances.fence("nobody.test", None)
    assert store.instances.get_fence("nobody.test") is None
