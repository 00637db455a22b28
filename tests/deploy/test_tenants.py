"""Tenants in process, on a real store and home (no router is needed: nothing here is
routed): the lay-down of new instances, and boot carrying on what a crash left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keelway.api.daemon import DeployParts
from keelway.data.instance_db import is_empty_wal
from keelway.deploy.errors import NotFoundError, UserError
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.runtime.environment import INSTANCE_KEY, read_env_file
from keelway.store import SqliteStore
from keelway.store.lifecycle import OpState, Removal, StepState
from keelway.testing.dump import dump
from tests.deploy.wiring import wired


@pytest.fixture
def parts(tmp_path: Path) -> tuple[DeployParts, SqliteStore, Home]:
    return wired(tmp_path)


async def _boot(deploy: DeployParts) -> None:
    """What boot carries on after its reconciler pass: destroys, then removals and adds."""
    await deploy.apps.resume()
    await deploy.instances.resume()


def test_added_instances_are_laid_down_whole_in_one_journaled_step(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    deploy.apps.create_app("shop")
    added = asyncio.run(deploy.instances.add_instances("shop", ["a.test", "b.test"],
                                                       {"TIER": "gold"}))
    assert [i.host for i in added.instances] == ["a.test", "b.test"] and added.started == []
    for host in ("a.test", "b.test"):
        assert is_empty_wal(home.db_path(host))
        assert read_env_file(home.env_file(host))[INSTANCE_KEY]
    assert store.instances.adding_instances() == []
    (op,) = store.ops.list_operations("shop")
    assert (op.kind, op.instance, op.state) == (OpKind.ADD_INSTANCES, "a.test",
                                                OpState.SUCCEEDED)
    assert [(s.kind, s.state) for s in op.steps] == [(StepKind.LAY_DOWN, StepState.SUCCEEDED)]


def test_bad_input_is_refused_before_any_record_or_file(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    deploy.apps.create_app("shop")
    before = dump(store)
    for hosts, config in ((["ok.test", "Nope"], {}), (["ok.test", "ok.test"], {}),
                          (["ok.test"], {"PORT": "1"}), (["ok.test"], {"bad name": "1"}),
                          ([], {})):
        with pytest.raises(UserError):
            asyncio.run(deploy.instances.add_instances("shop", hosts, config))
    with pytest.raises(NotFoundError):
        asyncio.run(deploy.instances.add_instances("nope", ["ok.test"], {}))
    assert dump(store) == before
    assert list((home.root / "data").iterdir()) == []


def test_boot_lays_down_instances_a_crash_left_recorded_but_not_laid_down(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})  # the intent, then the crash
    home.data_dir("a.test").mkdir(parents=True)  # half laid down: a dir, no database
    asyncio.run(_boot(deploy))
    assert is_empty_wal(home.db_path("a.test"))
    assert read_env_file(home.env_file("a.test"))[INSTANCE_KEY]
    assert store.instances.adding_instances() == []


def test_boot_ends_a_removal_whose_records_were_deleted_before_it_was_finished(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, _home = parts
    store.apps.create_app("shop")
    store.instances.add_instances("shop", ["a.test"], {})
    store.instances.finish_adding(["a.test"])
    op = store.ops.begin_operation("shop", "a.test", OpKind.REMOVE_INSTANCE, owner="gone")
    seq = store.ops.begin_step(op.id, StepKind.FORGET)
    store.instances.forget_instance("a.test")  # the crash came after this write, before the next
    asyncio.run(_boot(deploy))
    done = store.ops.get_operation(op.id)
    assert done is not None and done.state is OpState.SUCCEEDED
    assert [s.state for s in done.steps if s.seq == seq] == [StepState.SUCCEEDED]
    assert store.ops.unfinished_operations() == []


def test_a_destroy_needs_the_app_and_forgets_it_with_its_builds(
        parts: tuple[DeployParts, SqliteStore, Home]) -> None:
    deploy, store, home = parts
    deploy.apps.create_app("shop")
    build = home.builds_dir / "shop" / ("d" * 64)
    build.mkdir(parents=True)
    store.builds.record_build("shop", "d" * 64, str(build))
    assert asyncio.run(deploy.apps.destroy_app("shop", Removal.KEEP_DATA)) == []
    assert store.apps.get_app("shop") is None and not build.exists()
    with pytest.raises(NotFoundError):
        asyncio.run(deploy.apps.destroy_app("shop", Removal.KEEP_DATA))
    deploy.apps.create_app("shop")  # the name is free again


class _NoRouter(Publisher):
    """No router here: a removal's publish has nothing to push to."""

    async def publish(self, instance: str | None = None) -> int:
        return 0


def test_the_dry_runs_of_add_remove_and_destroy_change_nothing_and_are_what_they_journal(
        tmp_path: Path) -> None:
    deploy, store, home = wired(tmp_path, _NoRouter)
    deploy.apps.create_app("shop")
    before = dump(store)
    add = deploy.instances.plan_add_instances("shop", ["a.test", "b.test"], {})
    assert dump(store) == before and not (home.root / "data" / "a.test").exists()
    asyncio.run(deploy.instances.add_instances("shop", ["a.test", "b.test"], {}))
    (op,) = store.ops.list_operations("shop")
    assert [s.kind for s in op.steps] == [s.kind for s in add.steps]
    before = dump(store)
    remove = deploy.instances.plan_removal("shop", "a.test", Removal.PURGE_DATA)
    destroy = deploy.apps.plan_destroy_app("shop", Removal.KEEP_DATA)
    assert dump(store) == before
    asyncio.run(deploy.instances.remove_instance("shop", "a.test", Removal.PURGE_DATA))
    (op,) = store.ops.list_operations("shop", "a.test")[:1]
    assert [s.kind for s in op.steps] == [s.kind for s in remove.steps]
    assert [scope for scope, _ in destroy] == ["a.test", "b.test", ""]
    destroy = deploy.apps.plan_destroy_app("shop", Removal.KEEP_DATA)
    asyncio.run(deploy.apps.destroy_app("shop", Removal.KEEP_DATA))
    for scope, plan in destroy:
        (op,) = [o for o in store.ops.list_operations("shop", scope)
                 if o.kind is OpKind.DESTROY]
        assert [s.kind for s in op.steps] == [s.kind for s in plan.steps]
