"""`dump(store)`: every record a write can change, as tests compare them before and
after an error ("nothing changed"), read through the `Store` protocol alone, so it is
one function for every backend and no backend carries a test-only method.

It leaves out events and the journals (operations, steps, idempotency keys, rollouts),
which an error may append to (a failed deploy journals its halted rollout). Each table
is a list of plain dicts (msgspec's builtins of the records), in the protocol's order of
each read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from keelway.store.store import Store


def dump(store: Store) -> dict[str, list[dict[str, Any]]]:
    """The records of `store`, by table: apps, instances (with the seed their record
    names), builds, releases, active, inhibitions, port_claims (the one box-local
    fact a dump compares: pids and start ticks change with every spawn), routes (with the seed
    an import's row names), fences, aliases."""
    instances = store.instances.list_instances()
    known = {g for inst in instances for g in store.generations.generation_ids(inst.host)}
    generations = sorted(known | {g.id for g in store.generations.live_generations()})
    return {
        "apps": _rows(store.apps.list_apps()),
        "instances": [{**_row(inst), **_seed_of(store, inst.host)} for inst in instances],
        "builds": _rows(store.builds.list_builds()),
        "releases": [_row(r) for app in store.apps.list_apps()
                     for r in store.builds.list_releases(app.name)],
        "active": _rows(store.generations.list_active()),
        "inhibitions": [{"generation_id": gen_id, "reason": reason.value}
                        for gen_id in generations
                        for reason in store.generations.inhibitions(gen_id)],
        "port_claims": [{"port": port} for port in sorted(store.local.claimed_ports())],
        "routes": [{**_row(r), "seed": _route_seed(store, r.host, r.instance)}
                   for r in store.routes.list_routes()],
        "fences": [_row(f) for inst in instances
                   if (f := store.instances.get_fence(inst.host)) is not None],
        "aliases": _rows(store.instances.list_aliases()),
    }


def _row(record: msgspec.Struct) -> dict[str, Any]:
    row: dict[str, Any] = msgspec.to_builtins(record)
    return row


def _rows(records: list[Any]) -> list[dict[str, Any]]:
    return [_row(r) for r in records]


def _seed_of(store: Store, host: str) -> dict[str, Any]:
    record = store.imports.seed_record(host)
    return {"seed": record.seed if record else None,
            "seed_state": record.state.value if record and record.state else None}


def _route_seed(store: Store, host: str, instance: str) -> str | None:
    row = store.imports.row_at(host) if host == instance else None
    return row.seed if row is not None else None
