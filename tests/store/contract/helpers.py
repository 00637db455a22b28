"""Records the contract tests build through the protocol, and what an error must leave
as it was."""

from __future__ import annotations

from typing import Any

from keelway.journal import Inhibition
from keelway.store import Store
from keelway.store.lifecycle import RouteState
from keelway.store.records import Generation
from keelway.testing.dump import dump

DIGEST = "d" * 64
RETIRING = Inhibition.RETIREMENT_PENDING


def _instance(store: Store, host: str = "a.test") -> None:
    store.apps.ensure_app("blog")
    store.instances.ensure_instance(host, "blog")


def _gen(store: Store, service: str = "web", port: int | None = 4000,
         host: str = "a.test") -> Generation:
    _instance(store, host)
    return store.plan_generation(app="blog", instance=host, service=service,
                                             release=1, build_digest=DIGEST, op_id=None,
                                             port=port)


def _running(store: Store, **kw: Any) -> Generation:
    gen = _gen(store, **kw)
    return store.record_spawn(gen, pid=100 + gen.id, start_ticks=7)


def _fresh(store: Store, gen: Generation) -> Generation:
    latest = store.generations.get_generation(gen.id)
    assert latest is not None
    return latest


def _everything(store: Store) -> tuple[Any, ...]:
    """What an error must leave as it was."""
    return (dump(store), store.generations.live_generations(),
            store.builds.list_releases("blog"), store.generations.pending_retries(),
            store.apps.list_apps())


def _serving(store: Store, host: str, port: int = 4000) -> int:
    gen = store.plan_generation(app="shop", instance=host, service="web",
                                             release=1, build_digest="d" * 64, op_id=None,
                                             port=port)
    store.generations.set_active(host, "web", gen.id, expected=None)
    store.routes.set_route(host, host, RouteState.SERVING, port, gen.id, expected=None)
    return gen.id
