"""The contract of `InstanceStore` (store.instances: instances, domains, fences,
identity numbers, the bulk view), on every backend."""

from __future__ import annotations

import time

import pytest

from keelway.journal import OpKind, StepKind
from keelway.store import Conflict, NotFound, Store
from keelway.store.hosts import HostTaken
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import (
    GenState,
    InstanceState,
    OpState,
    Removal,
    RouteState,
)
from keelway.store.records import CrashRetry
from tests.store.contract.conftest import OpenStore
from tests.store.contract.helpers import (
    DIGEST,
    RETIRING,
    _everything,
    _instance,
    _serving,
    dump,
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
    web = store.plan_generation(app="blog", instance="a.test", service="web", release=1,
                                build_digest=DIGEST, op_id=op.id, port=4100)
    worker = store.plan_generation(app="blog", instance="b.test", service="worker",
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


def test_adding_instances_records_them_all_marked_adding_with_their_config(
        store: Store) -> None:
    store.apps.create_app("shop")
    added = store.instances.add_instances("shop", ["a.test", "b.test"], {"TIER": "gold"})
    assert [i.host for i in added] == ["a.test", "b.test"]
    assert all(i.adding and i.config == {"TIER": "gold"} for i in added)
    assert [i.host for i in store.instances.adding_instances()] == ["a.test", "b.test"]
    store.instances.finish_adding(["a.test", "b.test"])
    assert store.instances.adding_instances() == []


def test_one_taken_host_refuses_the_whole_add_and_writes_nothing(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    before = dump(store)
    with pytest.raises(HostTaken, match=r"a\.test is already an instance of app shop"):
        store.instances.add_instances("shop", ["new.test", "a.test"], {})
    with pytest.raises(Conflict, match="twice"):
        store.instances.add_instances("shop", ["x.test", "x.test"], {})
    with pytest.raises(NotFound):
        store.instances.add_instances("nope", ["y.test"], {})
    assert dump(store) == before


def test_a_host_is_either_a_primary_or_one_alias_never_both(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test", "b.test"], {})
    store.instances.add_aliases("a.test", ["www.a.test"])
    before = dump(store)
    with pytest.raises(HostTaken, match=r"alias of a\.test"):
        store.instances.add_aliases("b.test", ["www.a.test"])
    with pytest.raises(HostTaken, match="instance of app shop"):
        store.instances.add_aliases("a.test", ["b.test"])
    with pytest.raises(HostTaken):
        store.instances.add_instances("shop", ["www.a.test"], {})
    with pytest.raises(HostTaken):
        store.instances.ensure_instance("www.a.test", "shop")  # what a deploy --host does
    assert dump(store) == before
    # The alias it already has is kept (idempotent).
    assert [a.host for a in store.instances.add_aliases("a.test", ["www.a.test"])] == ["www.a.test"]


def test_an_alias_route_mirrors_every_write_of_its_instance_route(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    gen_id = _serving(store, "a.test")
    store.instances.add_aliases("a.test", ["www.a.test", "a.example"])
    for alias in ("www.a.test", "a.example"):
        route = store.routes.get_route(alias)
        assert route is not None and route.instance == "a.test"
        assert (route.state, route.port, route.generation_id) == (RouteState.SERVING, 4000,
                                                                  gen_id)
    primary = store.routes.get_route("a.test")
    store.routes.set_route("a.test", "a.test", RouteState.HOLDING, None, None, expected=primary)
    assert store.routes.get_route(
        "www.a.test").state is RouteState.HOLDING  # type: ignore[union-attr]
    store.activate_and_route("a.test", {"web": gen_id})  # an intent that writes the route
    alias = store.routes.get_route("a.example")
    assert alias is not None and alias.state is RouteState.SERVING and alias.port == 4000
    assert store.record_crash(CrashRetry("a.test", "web", gen_id, 1, 1.0, 2.0)) is True
    assert {r.state for r in store.routes.list_routes()} == {RouteState.GATED}  # the alias too
    store.instances.remove_aliases("a.test", ["a.example"])
    assert store.routes.get_route("a.example") is None
    assert [r.host for r in store.routes.list_routes()] == ["a.test", "www.a.test"]


def test_removing_an_alias_of_another_instance_is_refused_whole(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test", "b.test"], {})
    store.instances.add_aliases("a.test", ["www.a.test"])
    with pytest.raises(NotFound):
        store.instances.remove_aliases("b.test", ["www.a.test"])
    assert [a.host for a in store.instances.list_aliases("a.test")] == ["www.a.test"]


def test_withdrawing_stops_the_instance_and_gates_its_routes_aliases_too(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    _serving(store, "a.test")
    store.instances.add_aliases("a.test", ["www.a.test"])
    assert store.instances.withdraw_instance("a.test", Removal.KEEP_DATA) is True
    inst = store.instances.get_instance("a.test")
    assert inst is not None and inst.state is InstanceState.STOPPED
    assert inst.removing == Removal.KEEP_DATA
    assert {(r.host, r.state, r.port) for r in store.routes.list_routes()} == {
        ("a.test", RouteState.GATED, None), ("www.a.test", RouteState.GATED, None)}
    # A purge asked once stays asked, whatever a repeat says.
    store.instances.withdraw_instance("a.test", Removal.PURGE_DATA)
    store.instances.withdraw_instance("a.test", Removal.KEEP_DATA)
    assert [i.removing for i in store.instances.removing_instances()] == [Removal.PURGE_DATA]


def test_an_instance_is_forgotten_only_once_every_generation_is_gone(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    gen_id = _serving(store, "a.test")
    store.instances.add_aliases("a.test", ["www.a.test"])
    with pytest.raises(Conflict, match="not proven gone"):
        store.instances.forget_instance("a.test")
    assert store.instances.get_instance("a.test") is not None
    store.record_gone(gen_id, 0)
    store.instances.forget_instance("a.test")
    tables = dump(store)
    assert [tables[t] for t in ("instances", "routes", "aliases", "active", "port_claims")] == [
        [], [], [], [], []]
    assert store.generations.get_generation(gen_id) is None
    # The host can be used again.
    store.instances.add_instances("shop", ["a.test"], {})


def test_an_unfinished_operation_of_a_forgotten_instance_is_found(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test", "b.test"], {})
    gone = store.ops.begin_operation("shop", "a.test", OpKind.REMOVE_INSTANCE, owner="me")
    store.ops.begin_operation("shop", "b.test", OpKind.DEPLOY, owner="me")
    store.instances.forget_instance("a.test")
    assert store.ops.unfinished_operations() == [gone.id]


def test_instance_config_is_compared_and_swapped(store: Store) -> None:
    store.apps.create_app("shop")
    (inst,) = store.instances.add_instances("shop", ["a.test"], {"A": "1"})
    new = store.instances.set_instance_config(inst, {"A": "2"})
    assert new.config == {"A": "2"}
    with pytest.raises(Conflict):
        store.instances.set_instance_config(inst, {"A": "3"})


def test_500_instances_are_recorded_in_one_fast_write(store: Store) -> None:
    store.apps.create_app("shop")
    hosts = [f"t{n}.shop.test" for n in range(500)]
    began = time.monotonic()
    added = store.instances.add_instances("shop", hosts, {})
    store.instances.finish_adding(hosts)
    assert time.monotonic() - began < 1.0
    assert len(added) == 500 and len(store.instances.list_instances("shop")) == 500


def test_a_generation_that_is_gone_keeps_no_claim_after_forget(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    gen_id = _serving(store, "a.test", port=4100)
    store.record_gone(gen_id, None)
    assert store.generations.get_generation(
        gen_id).state is GenState.GONE  # type: ignore[union-attr]
    store.instances.forget_instance("a.test")
    assert store.local.claimed_ports() == set()


def test_a_host_claims_what_it_names_an_instance_an_alias_or_nothing(store: Store) -> None:
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    store.instances.add_aliases("a.test", ["www.a.test"])
    primary = store.instances.claim("a.test")
    alias = store.instances.claim("www.a.test")
    assert primary is not None and (primary.instance, primary.app, primary.alias) == (
        "a.test", "shop", False)
    assert alias is not None and (alias.instance, alias.app, alias.alias) == (
        "a.test", "shop", True)
    assert store.instances.claim("nobody.test") is None
    assert [a.host for a in store.instances.list_aliases()] == ["www.a.test"]


def test_only_held_fences_are_listed_as_fenced(store: Store) -> None:
    _instance(store, "a.test")
    _instance(store, "b.test")
    fence = store.instances.fence("a.test", "restore")
    store.instances.fence("b.test", None)
    assert store.instances.fenced_instances() == {"a.test", "b.test"}
    store.instances.unfence("a.test", fence.generation)
    assert store.instances.fenced_instances() == {"b.test"}
    # Every record is listed, a lifted one too, as `get_fence` reads it.
    assert store.instances.list_fences() == [store.instances.get_fence("a.test"),
                                             store.instances.get_fence("b.test")]
    assert [f.held for f in store.instances.list_fences()] == [False, True]


def test_a_removal_s_intent_is_recorded_once_and_a_purge_stays_asked(store: Store) -> None:
    _instance(store)
    store.instances.mark_removing("a.test", Removal.PURGE_DATA)
    store.instances.mark_removing("a.test", Removal.KEEP_DATA)
    assert [(i.host, i.removing) for i in store.instances.removing_instances()] == [
        ("a.test", Removal.PURGE_DATA)]
    before = dump(store)
    with pytest.raises(NotFound):
        store.instances.mark_removing("nobody.test", Removal.KEEP_DATA)
    assert dump(store) == before


def test_instance_views_leave_out_the_steps_of_a_latest_operation_that_succeeded(
        store: Store) -> None:
    """records.InstanceView: a succeeded operation leaves nothing to converge, so its
    steps (most of a thousand instances' rows) are not read in bulk; a failed or an
    unfinished one's are, and `get_operation` reads any one's."""
    store.apps.ensure_app("blog")
    ops = {}
    for host, end in (("a.test", OpState.SUCCEEDED), ("b.test", OpState.FAILED),
                      ("c.test", None)):
        store.instances.ensure_instance(host, "blog")
        op = store.ops.begin_operation("blog", host, OpKind.RESTART, owner="me")
        store.ops.begin_step(op.id, StepKind.STOP, service="web")
        ops[host] = op if end is None else store.ops.finish_operation(
            store.ops.get_operation(op.id) or op, end)
    views = {v.instance.host: v.latest for v in store.instances.instance_views()}
    assert {h: len(op.steps) if op else None for h, op in views.items()} == {
        "a.test": 0, "b.test": 1, "c.test": 1}
    succeeded = store.ops.get_operation(ops["a.test"].id)
    assert succeeded is not None and len(succeeded.steps) == 1
