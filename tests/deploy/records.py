"""Records for the daemon-less plan tests: a fresh store, and the few facts a plan
reads (an app with a release, instances, live generations, ACTIVE), written through the
store's own methods. Plan tests reach the store through `fresh` only, so one place says
which backend they run on."""

from __future__ import annotations

from pathlib import Path

from keelway.store import SqliteStore, Store
from keelway.store.records import Generation
from keelway.testing.clock import FakeClock


def fresh(tmp_path: Path) -> Store:
    return SqliteStore(tmp_path / "records.db", FakeClock())


def released(store: Store, app: str, hosts: list[str]) -> int:
    """`app` with one release and `hosts` recorded (nothing running); its number."""
    store.create_app(app)
    store.add_instances(app, hosts, {}, parked=False)
    store.record_build(app, "d" * 64, "/nonexistent")
    return store.create_release(app, "d" * 64, {}, "first").number


def running(store: Store, app: str, host: str, services: list[str],
            release: int = 1) -> list[Generation]:
    """A live generation of each of `services` at `host`, each ACTIVE."""
    gens = []
    for number, service in enumerate(services):
        gen = store.plan_generation(app=app, instance=host, service=service,
                                    release=release, build_digest="d" * 64, op_id=None,
                                    port=None)
        gen = store.record_spawn(gen, 10_000 + number, 1)
        active = next((a for a in store.list_active(host) if a.service == service), None)
        store.set_active(host, service, gen.id, expected=active)
        gens.append(gen)
    return gens
