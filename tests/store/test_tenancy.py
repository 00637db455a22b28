"""The store's tenancy intents: each one transaction, all or none, and the one rule of
hosts (an instance's primary or one alias, never both, never twice)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keelway.data.instance_db import is_empty_wal, lay_down_db
from keelway.journal import OpKind
from keelway.store import Conflict, NotFound, Store
from keelway.store.hosts import HostTaken
from keelway.store.lifecycle import GenState, InstanceState, Removal, RouteState
from keelway.store.records import CrashRetry
from keelway.testing.dump import dump as dump_of


def _serving(store: Store, host: str, port: int = 4000) -> int:
    gen = store.plan_generation(app="shop", instance=host, service="web", release=1,
                                build_digest="d" * 64, op_id=None, port=port)
    store.set_active(host, "web", gen.id, expected=None)
    store.set_route(host, host, RouteState.SERVING, port, gen.id, expected=None)
    return gen.id


def test_adding_instances_records_them_all_marked_adding_with_their_config(
        store: Store) -> None:
    store.create_app("shop")
    added = store.add_instances("shop", ["a.test", "b.test"], {"TIER": "gold"})
    assert [i.host for i in added] == ["a.test", "b.test"]
    assert all(i.adding and i.config == {"TIER": "gold"} for i in added)
    assert [i.host for i in store.adding_instances()] == ["a.test", "b.test"]
    store.finish_adding(["a.test", "b.test"])
    assert store.adding_instances() == []


def test_one_taken_host_refuses_the_whole_add_and_writes_nothing(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test"], {})
    before = dump_of(store)
    with pytest.raises(HostTaken, match=r"a\.test is already an instance of app shop"):
        store.add_instances("shop", ["new.test", "a.test"], {})
    with pytest.raises(Conflict, match="twice"):
        store.add_instances("shop", ["x.test", "x.test"], {})
    with pytest.raises(NotFound):
        store.add_instances("nope", ["y.test"], {})
    assert dump_of(store) == before


def test_creating_an_app_twice_is_a_conflict(store: Store) -> None:
    store.create_app("shop")
    with pytest.raises(Conflict):
        store.create_app("shop")


def test_a_host_is_either_a_primary_or_one_alias_never_both(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test", "b.test"], {})
    store.add_aliases("a.test", ["www.a.test"])
    before = dump_of(store)
    with pytest.raises(HostTaken, match=r"alias of a\.test"):
        store.add_aliases("b.test", ["www.a.test"])
    with pytest.raises(HostTaken, match="instance of app shop"):
        store.add_aliases("a.test", ["b.test"])
    with pytest.raises(HostTaken):
        store.add_instances("shop", ["www.a.test"], {})
    with pytest.raises(HostTaken):
        store.ensure_instance("www.a.test", "shop")  # what a deploy --host does
    assert dump_of(store) == before
    # The alias it already has is kept (idempotent).
    assert [a.host for a in store.add_aliases("a.test", ["www.a.test"])] == ["www.a.test"]


def test_an_alias_route_mirrors_every_write_of_its_instance_route(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test"], {})
    gen_id = _serving(store, "a.test")
    store.add_aliases("a.test", ["www.a.test", "a.example"])
    for alias in ("www.a.test", "a.example"):
        route = store.get_route(alias)
        assert route is not None and route.instance == "a.test"
        assert (route.state, route.port, route.generation_id) == (RouteState.SERVING, 4000,
                                                                  gen_id)
    primary = store.get_route("a.test")
    store.set_route("a.test", "a.test", RouteState.HOLDING, None, None, expected=primary)
    assert store.get_route("www.a.test").state is RouteState.HOLDING  # type: ignore[union-attr]
    store.activate_and_route("a.test", {"web": gen_id})  # an intent that writes the route
    alias = store.get_route("a.example")
    assert alias is not None and alias.state is RouteState.SERVING and alias.port == 4000
    assert store.record_crash(CrashRetry("a.test", "web", gen_id, 1, 1.0, 2.0)) is True
    assert {r.state for r in store.list_routes()} == {RouteState.GATED}  # the alias too
    store.remove_aliases("a.test", ["a.example"])
    assert store.get_route("a.example") is None
    assert [r.host for r in store.list_routes()] == ["a.test", "www.a.test"]


def test_removing_an_alias_of_another_instance_is_refused_whole(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test", "b.test"], {})
    store.add_aliases("a.test", ["www.a.test"])
    with pytest.raises(NotFound):
        store.remove_aliases("b.test", ["www.a.test"])
    assert [a.host for a in store.list_aliases("a.test")] == ["www.a.test"]


def test_withdrawing_stops_the_instance_and_gates_its_routes_aliases_too(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test"], {})
    _serving(store, "a.test")
    store.add_aliases("a.test", ["www.a.test"])
    assert store.withdraw_instance("a.test", Removal.KEEP_DATA) is True
    inst = store.get_instance("a.test")
    assert inst is not None and inst.state is InstanceState.STOPPED
    assert inst.removing == Removal.KEEP_DATA
    assert {(r.host, r.state, r.port) for r in store.list_routes()} == {
        ("a.test", RouteState.GATED, None), ("www.a.test", RouteState.GATED, None)}
    # A purge asked once stays asked, whatever a repeat says.
    store.withdraw_instance("a.test", Removal.PURGE_DATA)
    store.withdraw_instance("a.test", Removal.KEEP_DATA)
    assert [i.removing for i in store.removing_instances()] == [Removal.PURGE_DATA]


def test_an_instance_is_forgotten_only_once_every_generation_is_gone(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test"], {})
    gen_id = _serving(store, "a.test")
    store.add_aliases("a.test", ["www.a.test"])
    with pytest.raises(Conflict, match="not proven gone"):
        store.forget_instance("a.test")
    assert store.get_instance("a.test") is not None
    store.record_gone(gen_id, 0)
    store.forget_instance("a.test")
    dump = dump_of(store)
    assert [dump[t] for t in ("instances", "routes", "aliases", "active", "port_claims")] == [
        [], [], [], [], []]
    assert store.get_generation(gen_id) is None
    # The host can be used again.
    store.add_instances("shop", ["a.test"], {})


def test_an_app_is_forgotten_once_it_has_no_instance_and_its_name_reused(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test"], {})
    store.record_build("shop", "d" * 64, "/builds/shop/d")
    store.create_release("shop", "d" * 64, {"A": "1"}, "Deploy")
    store.mark_destroying("shop", Removal.KEEP_DATA)
    assert [a.name for a in store.destroying_apps()] == ["shop"]
    with pytest.raises(NotFound):  # no new instance of an app being destroyed
        store.add_instances("shop", ["b.test"], {})
    with pytest.raises(Conflict, match="still has 1 instances"):
        store.forget_app("shop")
    store.forget_instance("a.test")
    store.forget_app("shop")
    assert store.get_app("shop") is None and store.list_releases("shop") == []
    assert store.list_builds("shop") == []
    store.create_app("shop")
    assert store.next_release_number("shop") == 1


def test_an_unfinished_operation_of_a_forgotten_instance_is_found(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test", "b.test"], {})
    gone = store.begin_operation("shop", "a.test", OpKind.REMOVE_INSTANCE, owner="me")
    store.begin_operation("shop", "b.test", OpKind.DEPLOY, owner="me")
    store.forget_instance("a.test")
    assert store.unfinished_operations() == [gone.id]


def test_instance_config_is_compared_and_swapped(store: Store) -> None:
    store.create_app("shop")
    (inst,) = store.add_instances("shop", ["a.test"], {"A": "1"})
    new = store.set_instance_config(inst, {"A": "2"})
    assert new.config == {"A": "2"}
    with pytest.raises(Conflict):
        store.set_instance_config(inst, {"A": "3"})


def test_500_instances_are_recorded_in_one_fast_write(store: Store) -> None:
    store.create_app("shop")
    hosts = [f"t{n}.shop.test" for n in range(500)]
    began = time.monotonic()
    added = store.add_instances("shop", hosts, {})
    store.finish_adding(hosts)
    assert time.monotonic() - began < 1.0
    assert len(added) == 500 and len(store.list_instances("shop")) == 500


def test_an_instance_database_is_laid_down_empty_in_wal_mode_once(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    assert lay_down_db(db) is True
    assert (db.stat().st_mode & 0o777) == 0o600
    assert is_empty_wal(db)
    db.write_bytes(db.read_bytes())  # the app's database: a repeat never touches it
    mtime = db.stat().st_mtime_ns
    assert lay_down_db(db) is False
    assert db.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")) == []


def test_a_generation_that_is_gone_keeps_no_claim_after_forget(store: Store) -> None:
    store.create_app("shop")
    store.add_instances("shop", ["a.test"], {})
    gen_id = _serving(store, "a.test", port=4100)
    store.record_gone(gen_id, None)
    assert store.get_generation(gen_id).state is GenState.GONE  # type: ignore[union-attr]
    store.forget_instance("a.test")
    assert store.claimed_ports() == set()
