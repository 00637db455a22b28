"""The in-memory store's instances (InstanceStore): instances, their domains (aliases),
fences and identity numbers. The host rule is keelway/store/hosts.py's: a host names
one instance (its primary) or one alias of one instance, checked inside every write
that gives a host a meaning."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, TypeVar

import msgspec

from keelway.journal import Cause, Inhibition
from keelway.store.errors import Conflict, NotFound
from keelway.store.hosts import Claim, HostTaken
from keelway.store.identities import IdSpace, instance_name
from keelway.store.lifecycle import GenState, InstanceState, OpState, Removal, RouteState, check
from keelway.store.records import (
    Alias,
    Fence,
    Generation,
    Instance,
    InstanceView,
    Operation,
    Route,
)
from keelway.testing.memory_ops import latest_operation
from keelway.testing.memory_routes import delete_route, mirror_aliases
from keelway.testing.memory_tables import MemoryDb, MemoryTables, own, own_or_none, owned_where


class MemoryInstances:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    # -- instances ---------------------------------------------------------------------

    def get_instance(self, host: str) -> Instance | None:
        return own_or_none(self._db.tables.instances.get(host))

    def list_instances(self, app: str | None = None) -> list[Instance]:
        return owned_where(self._db.tables.instances, lambda i: app is None or i.app == app,
                           lambda i: (i.app, i.host))

    def ensure_instance(self, host: str, app: str) -> Instance:
        with self._db.write() as t:
            claim = claim_of(t, host)
            if claim is not None and (claim.alias or claim.app != app):
                raise HostTaken(host, claim)
            if host not in t.instances:
                if app not in t.apps:
                    raise NotFound(f"ensure instance {host} of {app}: no app {app}")
                t.instances[host] = Instance(host, app, InstanceState.RUNNING, 0, 0,
                                             self._db.clock.now(), 1)
            allocate(t, IdSpace.UID, [instance_name(host)])
            return own(t.instances[host])

    def set_instance_state(self, inst: Instance, state: InstanceState,
                           down_reason: str | None = None) -> Instance:
        check(inst.state, state)  # the caller's copy: a stale one loses the swap anyway
        with self._db.write() as t:
            have = _current(t, inst)
            t.instances[inst.host] = msgspec.structs.replace(
                have, state=state, down_reason=down_reason, version=have.version + 1)
            return own(t.instances[inst.host])

    def bump_schedule(self, host: str) -> int:
        with self._db.write() as t:
            have = t.instances.get(host)
            if have is None:
                raise NotFound(f"instance {host}")
            t.instances[host] = msgspec.structs.replace(have,
                                                        schedule_rev=have.schedule_rev + 1)
            return have.schedule_rev + 1

    def add_instances(self, app: str, hosts: Sequence[str], config: Mapping[str, str],
                      parked: bool = False) -> list[Instance]:
        now = self._db.clock.now()
        with self._db.write() as t:
            have = t.apps.get(app)
            if have is None or have.destroying is not None:
                raise NotFound(f"app {app}")
            for host in hosts:
                if (claim := claim_of(t, host)) is not None:
                    raise HostTaken(host, claim)
            if len(set(hosts)) != len(hosts):
                raise Conflict("a host is given twice")
            numbers = [n for (a, n) in t.releases if a == app]
            pending = max(numbers) if parked and numbers else None
            state = InstanceState.PARKED if parked else InstanceState.RUNNING
            for host in hosts:
                t.instances[host] = Instance(
                    host, app, state, 0, 0, now, 1, config=dict(sorted(config.items())),
                    adding=True, pending_release=pending,
                    pending_cause=Cause.RELEASE if pending is not None else None)
            allocate(t, IdSpace.UID, [instance_name(h) for h in hosts])
            if parked:
                for host in hosts:
                    if host in t.routes:
                        raise Conflict(f"the route of {host} was written under us")
                    t.routes[host] = Route(host, host, RouteState.PARKED, None, None, 1)
            return [own(t.instances[h]) for h in hosts]

    def adding_instances(self) -> list[Instance]:
        return self._where(lambda i: i.adding)

    def finish_adding(self, hosts: Sequence[str]) -> None:
        with self._db.write() as t:
            for host in hosts:
                if (have := t.instances.get(host)) is not None:
                    t.instances[host] = msgspec.structs.replace(have, adding=False)

    def set_instance_config(self, inst: Instance, config: Mapping[str, str]) -> Instance:
        with self._db.write() as t:
            have = _current(t, inst)
            t.instances[inst.host] = msgspec.structs.replace(
                have, config=dict(sorted(config.items())), version=have.version + 1)
            return own(t.instances[inst.host])

    def mark_removing(self, host: str, removal: Removal) -> None:
        with self._db.write() as t:
            _mark_removal(t, host, removal)

    def withdraw_instance(self, host: str, removal: Removal) -> bool:
        with self._db.write() as t:
            _mark_removal(t, host, removal, state=InstanceState.STOPPED)
            routed = False
            for route in [r for r in t.routes.values() if r.instance == host]:
                routed = True
                t.routes[route.host] = msgspec.structs.replace(
                    route, state=RouteState.GATED, port=None, generation_id=None,
                    version=route.version + 1)
            return routed

    def removing_instances(self) -> list[Instance]:
        return self._where(lambda i: i.removing is not None)

    def forget_instance(self, host: str) -> None:
        with self._db.write() as t:
            gens = [g for g in t.generations.values() if g.instance == host]
            live = sum(1 for g in gens if g.state is not GenState.GONE)
            if live:
                raise Conflict(f"{host} still has {live} generations not proven gone")
            ids = {g.id for g in gens}
            named = sorted(a.generation_id for a in t.active.values()
                           if a.instance != host and a.generation_id in ids)
            if named:
                # Another instance's ACTIVE names one (never so in keelway's own writes):
                # a record may not outlive the generation it names. NotFound, as the
                # SQLite store's foreign key says it (a Conflict would say it better).
                raise NotFound(f"forget {host}: generations {named} are ACTIVE elsewhere")
            for route in [r for r in t.routes.values() if r.instance == host]:
                delete_route(t, route.host)
            _drop(t.aliases, [a.host for a in t.aliases.values() if a.instance == host])
            _drop(t.active, [k for k in t.active if k[0] == host])
            _drop(t.backoff, [k for k in t.backoff if k[0] == host])
            _drop(t.inhibitions, [k for k in t.inhibitions if k[0] in ids])
            _drop(t.port_claims, [p for p, g in t.port_claims.items() if g in ids])
            _drop(t.presences, [g for g in t.presences if g in ids])
            _drop(t.generations, list(ids))
            _drop(t.fences, [host])
            _drop(t.seeds, [host])
            _drop(t.instances, [host])

    def _where(self, keep: Callable[[Instance], bool]) -> list[Instance]:
        return owned_where(self._db.tables.instances, keep, lambda i: i.host)

    # -- hosts and aliases ---------------------------------------------------------------

    def claim(self, host: str) -> Claim | None:
        return claim_of(self._db.tables, host)

    def add_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]:
        now = self._db.clock.now()
        with self._db.write() as t:
            if instance not in t.instances:
                raise NotFound(f"instance {instance}")
            for host in hosts:
                claim = claim_of(t, host)
                if claim is not None and not (claim.alias and claim.instance == instance):
                    raise HostTaken(host, claim)
            for host in hosts:
                t.aliases.setdefault(host, Alias(host, instance, now))
            mirror_aliases(t, instance)
        return self.list_aliases(instance)

    def remove_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]:
        with self._db.write() as t:
            for host in hosts:
                alias = t.aliases.get(host)
                if alias is None or alias.instance != instance:
                    raise NotFound(f"{host} is not an alias of {instance}")
            for host in hosts:
                route = t.routes.get(host)
                if route is not None and route.instance == instance:
                    delete_route(t, host)
                t.aliases.pop(host, None)
        return self.list_aliases(instance)

    def list_aliases(self, instance: str | None = None) -> list[Alias]:
        return [a for _, a in sorted(self._db.tables.aliases.items())
                if instance is None or a.instance == instance]

    def identity_number(self, space: IdSpace, name: str) -> int:
        # A number allocated is read without a write (a stale owner may read it).
        if (number := self._db.tables.identities.get((space.value, name))) is not None:
            return number
        with self._db.write() as t:
            allocate(t, space, [name])
            return t.identities[(space.value, name)]

    # -- fences ------------------------------------------------------------------------

    def get_fence(self, instance: str) -> Fence | None:
        return self._db.tables.fences.get(instance)

    def fenced(self, instance: str) -> bool:
        fence = self._db.tables.fences.get(instance)
        return fence is not None and fence.held

    def fence(self, instance: str, reason: str | None) -> Fence:
        with self._db.write() as t:
            if instance not in t.instances:
                raise NotFound(f"instance {instance}")
            bump_fence(t, instance, reason, self._db.clock.now())
            return t.fences[instance]

    def unfence(self, instance: str, generation: int) -> tuple[Fence | None, bool]:
        with self._db.write() as t:
            have = t.fences.get(instance)
            if have is None or have.generation != generation or not have.held:
                return have, False
            t.fences[instance] = msgspec.structs.replace(have, held=False,
                                                         updated_at=self._db.clock.now())
            return t.fences[instance], True

    def fenced_instances(self) -> set[str]:
        return {f.instance for f in self._db.tables.fences.values() if f.held}

    def list_fences(self) -> list[Fence]:
        return [fence for _, fence in sorted(self._db.tables.fences.items())]

    def instance_views(self) -> list[InstanceView]:
        t = self._db.tables
        active: dict[str, dict[str, int]] = {}
        for (host, service), a in sorted(t.active.items()):
            active.setdefault(host, {})[service] = a.generation_id
        live: dict[str, list[Generation]] = {}
        for _, g in sorted(t.generations.items()):
            if g.state is not GenState.GONE:
                live.setdefault(g.instance, []).append(g)
        marks: dict[int, set[Inhibition]] = {}
        for gen_id, reason in t.inhibitions:
            marks.setdefault(gen_id, set()).add(reason)
        fenced = self.fenced_instances()

        def latest(host: str) -> Operation | None:  # steps as records.InstanceView says
            op = latest_operation(t, host)
            if op is not None and op.state is OpState.SUCCEEDED:
                return msgspec.structs.replace(op, steps=[])
            return op

        return [InstanceView(
            instance=inst, latest=latest(inst.host),  # both owned
            active=active.get(inst.host, {}), live=live.get(inst.host, []),
            inhibitions={g.id: frozenset(marks.get(g.id, ())) for g in live.get(inst.host, [])},
            route=t.routes.get(inst.host), fenced=inst.host in fenced,
        ) for inst in self.list_instances()]


_K = TypeVar("_K")


def claim_of(t: MemoryTables, host: str) -> Claim | None:
    """The host rule (keelway/store/hosts.py `claim_of`), read inside the caller's write."""
    inst = t.instances.get(host)
    if inst is not None:
        return Claim(host, inst.app, alias=False)
    alias = t.aliases.get(host)
    if alias is not None and (owner := t.instances.get(alias.instance)) is not None:
        return Claim(alias.instance, owner.app, alias=True)
    return None


def allocate(t: MemoryTables, space: IdSpace, names: Iterable[str]) -> None:
    """The next number of `space` to each new name, never given to another
    (keelway/store/identities.py)."""
    for name in names:
        if (space.value, name) not in t.identities:
            taken = [n for (s, _), n in t.identities.items() if s == space.value]
            t.identities[(space.value, name)] = max(taken, default=-1) + 1


def bump_fence(t: MemoryTables, instance: str, reason: str | None, now: float) -> None:
    """A new held fence generation, one more than any before."""
    have = t.fences.get(instance)
    t.fences[instance] = Fence(instance, have.generation + 1 if have else 1, True, reason,
                               now)


def _current(t: MemoryTables, inst: Instance) -> Instance:
    """The compare of an instance's compare-and-swap, inside the writer's write."""
    have = t.instances.get(inst.host)
    if have is None or have.version != inst.version:
        raise Conflict(f"instance {inst.host} changed under us")
    return have


def kept_removal(have: str | None, removal: Removal) -> str:
    """A purge asked once stays asked."""
    return Removal.PURGE_DATA.value if have == Removal.PURGE_DATA.value else removal.value


def _mark_removal(t: MemoryTables, host: str, removal: Removal, **sets: Any) -> None:
    """A removal's durable intent on the instance, with the fields `sets`, inside a
    write (as keelway/store/db.py's `mark_removal`); `NotFound` without the instance."""
    have = t.instances.get(host)
    if have is None:
        raise NotFound(f"instance {host}")
    t.instances[host] = msgspec.structs.replace(
        have, removing=kept_removal(have.removing, removal), version=have.version + 1, **sets)


def _drop(table: MutableMapping[_K, Any], keys: Iterable[_K]) -> None:
    for key in keys:
        table.pop(key, None)
