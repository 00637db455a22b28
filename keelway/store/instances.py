"""The SQLite store's instances: their records, added and removed in bulk, their
aliases (domains), their fences and identity numbers, and the bulk view convergence
reads. The rule of hosts these writes check is keelway/store/hosts.py.

Fences: one row per instance that was ever fenced (table `fences`). A fence's generation
only grows (each `fence` bumps it, in SQL, so two writers never hand out one generation
twice); `unfence` lifts only the generation it names, so a lift from a holder whose fence
was superseded by a newer one changes nothing. The `instances.fence` column of
migration 1 is not used: the row in `fences` is the one record.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence

from keelway.journal import Cause
from keelway.store import identities
from keelway.store.db import Db, mark_removal, swap
from keelway.store.errors import Conflict, NotFound
from keelway.store.generations import SqliteGenerations
from keelway.store.hosts import Claim, HostTaken, claim_of, mirror_aliases, refuse_claimed
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import GenState, InstanceState, Removal, RouteState, check
from keelway.store.operations import SqliteOperations
from keelway.store.records import Alias, Fence, Generation, Instance, InstanceView
from keelway.store.routes import SqliteRoutes

__all__ = ["Claim", "HostTaken", "Removal", "SqliteInstances", "instance_of"]


class SqliteInstances:
    """Instances, aliases, fences and identity numbers (`InstanceStore`). The bulk
    view reads the operations, generations and routes it is given."""

    def __init__(self, db: Db, *, ops: SqliteOperations, generations: SqliteGenerations,
                 routes: SqliteRoutes) -> None:
        self.db = db
        self._ops = ops
        self._generations = generations
        self._routes = routes

    # -- records -----------------------------------------------------------------------

    def get_instance(self, host: str) -> Instance | None:
        return self.db.first(instance_of, "SELECT * FROM instances WHERE host=?", host)

    def list_instances(self, app: str | None = None) -> list[Instance]:
        return [instance_of(r) for r in self.db.select("instances", order="app, host",
                                                        app=app)]

    def ensure_instance(self, host: str, app: str) -> Instance:
        with self.db.tx(f"ensure instance {host} of {app}", missing=f"no app {app}") as c:
            refuse_claimed(c, host, app)
            c.execute(
                "INSERT INTO instances(host, app, state, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(host) DO NOTHING",
                (host, app, InstanceState.RUNNING.value, self.db.clock.now()),
            )
            identities.allocate(c, IdSpace.UID, [identities.instance_name(host)])
            inst = self.get_instance(host)
        assert inst is not None
        return inst

    def set_instance_state(self, inst: Instance, state: InstanceState,
                           down_reason: str | None = None) -> Instance:
        check(inst.state, state)  # the caller's copy: a stale one loses the swap anyway
        with self.db.tx(f"set {inst.host} {state.value}") as c:
            swap(c, "instances", {"host": inst.host}, inst.version,
                 f"instance {inst.host} changed under us", state=state.value,
                 down_reason=down_reason)
            new = self.get_instance(inst.host)
        assert new is not None
        return new

    def bump_schedule(self, host: str) -> int:
        """Advance the instance's schedule revision; attempts holding an older one are stale."""
        with self.db.tx(f"bump the schedule of {host}") as c:
            c.execute(
                "UPDATE instances SET schedule_rev=schedule_rev+1 WHERE host=?",
                (host,),
            )
            row = self.db.row("SELECT schedule_rev FROM instances WHERE host=?", host)
        if row is None:
            raise NotFound(f"instance {host}")
        return int(row["schedule_rev"])

    def set_pending(self, host: str, number: int, cause: Cause) -> None:
        """Release `number` pending on `host` (the `defer_release` intent). A release
        still pending keeps its cause: a config change on top of a deferred release
        runs a new build all the same, and must fall back as one."""
        with self.db.tx(f"defer release {number} of {host}") as c:
            c.execute("UPDATE instances SET pending_release=?, pending_cause=CASE WHEN"
                      " pending_release IS NOT NULL AND pending_cause=? THEN pending_cause"
                      " ELSE ? END, version=version+1 WHERE host=?",
                      (number, Cause.RELEASE.value, cause.value, host))

    def clear_pending(self, host: str, number: int) -> None:
        """Forget the pending release of `host` if it is still `number`."""
        with self.db.tx(f"clear the pending release {number} of {host}") as c:
            c.execute("UPDATE instances SET pending_release=NULL, pending_cause=NULL,"
                      " version=version+1 WHERE host=? AND pending_release=?",
                      (host, number))

    # -- added and removed -------------------------------------------------------------

    def add_instances(self, app: str, hosts: Sequence[str],
                      config: Mapping[str, str], parked: bool = False) -> list[Instance]:
        """Record new instances of `app`, all or none, each `adding` until its files are
        laid down and it has started (`finish_adding`). `HostTaken` (nothing written)
        if any host already names something; `NotFound` if there is no such app.

        `parked`: each is recorded PARKED with a `parked` route (the router holds its
        first request and asks for a wake) and the app's latest release deferred to
        that wake, in the same write."""
        now = self.db.clock.now()
        encoded = json.dumps(dict(config), sort_keys=True)
        with self.db.tx(f"add {len(hosts)} instances of {app}") as c:
            if self.db.row("SELECT 1 FROM apps WHERE name=? AND destroying IS NULL",
                           app) is None:
                raise NotFound(f"app {app}")
            for host in hosts:
                if (claim := claim_of(c, host)) is not None:
                    raise HostTaken(host, claim)
            state = InstanceState.PARKED if parked else InstanceState.RUNNING
            latest = self.db.row("SELECT MAX(number) FROM releases WHERE app=?", app)
            pending = latest[0] if parked and latest is not None else None
            try:
                c.executemany(
                    "INSERT INTO instances(host, app, state, created_at, config, adding,"
                    " pending_release, pending_cause) VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                    [(h, app, state.value, now, encoded, pending,
                      Cause.RELEASE.value if pending is not None else None) for h in hosts])
            except sqlite3.IntegrityError as exc:  # a host given twice
                raise Conflict(f"a host is given twice: {exc}") from exc
            identities.allocate(c, IdSpace.UID, [identities.instance_name(h) for h in hosts])
            if parked:
                c.executemany("INSERT INTO routes(host, instance, state) VALUES (?, ?, ?)",
                              [(h, h, RouteState.PARKED.value) for h in hosts])
        return self._instances(hosts)

    def adding_instances(self) -> list[Instance]:
        return self._instances_where("adding=1")

    def finish_adding(self, hosts: Sequence[str]) -> None:
        with self.db.tx(f"finish adding {len(hosts)} instances") as c:
            c.executemany("UPDATE instances SET adding=0 WHERE host=?", [(h,) for h in hosts])

    def set_instance_config(self, inst: Instance, config: Mapping[str, str]) -> Instance:
        """Compare-and-swap on `inst.version`."""
        with self.db.tx(f"set the config of {inst.host}") as c:
            swap(c, "instances", {"host": inst.host}, inst.version,
                 f"instance {inst.host} changed under us",
                 config=json.dumps(dict(config), sort_keys=True))
        new = self._instances([inst.host])
        return new[0]

    def mark_removing(self, host: str, removal: Removal) -> None:
        """The durable intent of a removal, written before its operation begins: boot
        carries on an interrupted one. A purge asked once stays asked."""
        with self.db.tx(f"mark {host} removing") as c:
            if not mark_removal(c, "instances", "removing", "host", host, removal):
                raise NotFound(f"instance {host}")

    def withdraw_instance(self, host: str, removal: Removal) -> bool:
        """The first effect of a removal, in one write: the removal's durable intent,
        the instance STOPPED (so nothing restarts it), its routes (primary and aliases)
        gated. True if it had a route (the router must be told)."""
        with self.db.tx(f"withdraw {host}") as c:
            if not mark_removal(c, "instances", "removing", "host", host, removal,
                                state=InstanceState.STOPPED.value):
                raise NotFound(f"instance {host}")
            routed = self.db.row("SELECT 1 FROM routes WHERE instance=?", host) is not None
            c.execute("UPDATE routes SET state=?, port=NULL, generation_id=NULL,"
                      " version=version+1 WHERE instance=?", (RouteState.GATED.value, host))
        return routed

    def removing_instances(self) -> list[Instance]:
        return self._instances_where("removing IS NOT NULL")

    def forget_instance(self, host: str) -> None:
        """Delete an instance's records (its routes, aliases, ACTIVE, generations and
        backoff too), so the host can be used again. Refused (`Conflict`, nothing
        deleted) while any of its generations is not recorded gone: a record must name
        every process keelway started (SPEC §5.5). The journal stays."""
        with self.db.tx(f"forget {host}") as c:
            live = self.db.row(
                "SELECT COUNT(*) FROM generations WHERE instance=? AND state!=?",
                host, GenState.GONE.value)
            if live is not None and int(live[0]):
                raise Conflict(f"{host} still has {int(live[0])} generations not proven gone")
            c.execute("DELETE FROM routes WHERE instance=?", (host,))
            c.execute("DELETE FROM aliases WHERE instance=?", (host,))
            c.execute("DELETE FROM active WHERE instance=?", (host,))
            c.execute("DELETE FROM backoff WHERE instance=?", (host,))
            gens = "SELECT id FROM generations WHERE instance=?"
            c.execute(f"DELETE FROM inhibitions WHERE generation_id IN ({gens})", (host,))
            c.execute(f"DELETE FROM presences WHERE generation_id IN ({gens})", (host,))
            c.execute("DELETE FROM generations WHERE instance=?", (host,))
            c.execute("DELETE FROM fences WHERE instance=?", (host,))
            c.execute("DELETE FROM instances WHERE host=?", (host,))

    # -- hosts and aliases -------------------------------------------------------------

    def claim(self, host: str) -> Claim | None:
        with self.db.reading(f"read what {host} names") as c:
            return claim_of(c, host)

    def add_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]:
        """More hosts of `instance`, all or none, routed as its primary is, in the same
        write. An alias it already has is kept; `HostTaken` if a host names anything
        else, `NotFound` if there is no such instance."""
        now = self.db.clock.now()
        with self.db.tx(f"add aliases of {instance}") as c:
            if self.db.row("SELECT 1 FROM instances WHERE host=?", instance) is None:
                raise NotFound(f"instance {instance}")
            for host in hosts:
                claim = claim_of(c, host)
                if claim is not None and not (claim.alias and claim.instance == instance):
                    raise HostTaken(host, claim)
            c.executemany("INSERT INTO aliases(host, instance, created_at) VALUES (?, ?, ?)"
                          " ON CONFLICT(host) DO NOTHING", [(h, instance, now) for h in hosts])
            mirror_aliases(c, instance)
        return self.list_aliases(instance)

    def remove_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]:
        """Drop aliases of `instance` with their routes, all or none: `NotFound` if one
        is not an alias of it."""
        with self.db.tx(f"remove aliases of {instance}") as c:
            for host in hosts:
                if self.db.row("SELECT 1 FROM aliases WHERE host=? AND instance=?",
                               host, instance) is None:
                    raise NotFound(f"{host} is not an alias of {instance}")
            c.executemany("DELETE FROM routes WHERE host=? AND instance=?",
                          [(h, instance) for h in hosts])
            c.executemany("DELETE FROM aliases WHERE host=?", [(h,) for h in hosts])
        return self.list_aliases(instance)

    def list_aliases(self, instance: str | None = None) -> list[Alias]:
        return [Alias(r["host"], r["instance"], r["created_at"])
                for r in self.db.select("aliases", order="host", instance=instance)]

    # -- identity numbers --------------------------------------------------------------

    def identity_number(self, space: IdSpace, name: str) -> int:
        """The number of `name` in `space`. Apps and instances are written with theirs;
        a name a store from before identities holds gets its number at this first ask."""
        row = self.db.row("SELECT n FROM identities WHERE space=? AND name=?",
                          space.value, name)
        if row is not None:
            return int(row["n"])
        with self.db.tx(f"allocate the {space.value} of {name}") as c:
            identities.allocate(c, space, [name])
            row = self.db.row("SELECT n FROM identities WHERE space=? AND name=?",
                              space.value, name)
        assert row is not None
        return int(row["n"])

    # -- fences ------------------------------------------------------------------------

    def get_fence(self, instance: str) -> Fence | None:
        return self.db.first(_fence, "SELECT * FROM fences WHERE instance=?", instance)

    def fenced(self, instance: str) -> bool:
        row = self.db.row("SELECT held FROM fences WHERE instance=?", instance)
        return bool(row and row["held"])

    def fence(self, instance: str, reason: str | None) -> Fence:
        with self.db.tx(f"fence {instance}") as c:
            if self.db.row("SELECT 1 FROM instances WHERE host=?", instance) is None:
                raise NotFound(f"instance {instance}")
            c.execute(
                "INSERT INTO fences(instance, generation, held, reason, updated_at)"
                " VALUES (?, 1, 1, ?, ?) ON CONFLICT(instance) DO UPDATE SET"
                " generation=fences.generation+1, held=1, reason=excluded.reason,"
                " updated_at=excluded.updated_at",
                (instance, reason, self.db.clock.now()))
            fence = self.get_fence(instance)
        assert fence is not None  # written inside this transaction
        return fence

    def unfence(self, instance: str, generation: int) -> tuple[Fence | None, bool]:
        with self.db.tx(f"unfence {instance}") as c:
            cur = c.execute(
                "UPDATE fences SET held=0, updated_at=? WHERE instance=? AND generation=?"
                " AND held=1", (self.db.clock.now(), instance, generation))
            lifted = cur.rowcount == 1
            fence = self.get_fence(instance)
        return fence, lifted

    def fenced_instances(self) -> set[str]:
        """Every instance a fence holds, in one query (the bulk view reads it)."""
        return {r[0] for r in self.db.rows("SELECT instance FROM fences WHERE held=1")}

    def list_fences(self) -> list[Fence]:
        return [_fence(r) for r in self.db.rows("SELECT * FROM fences ORDER BY instance")]

    # -- the bulk view -----------------------------------------------------------------

    def instance_views(self) -> list[InstanceView]:
        """Every instance as convergence reads it, in a fixed handful of queries: boot
        and the periodic pass plan 10,000 instances without 60,000 round trips. Read
        without an await between its queries, so it is one consistent picture for the
        control plane that holds the only writer."""
        latest = self._ops.latest_operations()
        marks = self._generations.all_inhibitions()
        active: dict[str, dict[str, int]] = {}
        for a in self._generations.list_active():
            active.setdefault(a.instance, {})[a.service] = a.generation_id
        live: dict[str, list[Generation]] = {}
        for g in self._generations.live_generations():
            live.setdefault(g.instance, []).append(g)
        routes = {r.host: r for r in self._routes.list_routes()}
        fenced = self.fenced_instances()
        return [InstanceView(
            instance=inst, latest=latest.get(inst.host), active=active.get(inst.host, {}),
            live=live.get(inst.host, []),
            inhibitions={g.id: marks.get(g.id, frozenset()) for g in live.get(inst.host, [])},
            route=routes.get(inst.host), fenced=inst.host in fenced,
        ) for inst in self.list_instances()]

    # -- reads -------------------------------------------------------------------------

    def _instances(self, hosts: Sequence[str]) -> list[Instance]:
        """The instances named, in the order given (500 hosts a query: under SQLite's
        limit of bound variables)."""
        found: dict[str, Instance] = {}
        for start in range(0, len(hosts), 500):
            chunk = list(hosts[start:start + 500])
            marks = ",".join("?" * len(chunk))
            for row in self.db.rows(f"SELECT * FROM instances WHERE host IN ({marks})",
                                    *chunk):
                found[row["host"]] = instance_of(row)
        return [found[h] for h in hosts if h in found]

    def _instances_where(self, where: str) -> list[Instance]:
        return [instance_of(r) for r in self.db.select("instances", where=where, order="host")]


def instance_of(r: sqlite3.Row) -> Instance:
    # Most instances have no config of their own: a bulk read of 10,000 does not parse
    # "{}" 10,000 times.
    config = r["config"]
    return Instance(r["host"], r["app"], InstanceState(r["state"]), r["fence"],
                    r["schedule_rev"], r["created_at"], r["version"], r["down_reason"],
                    json.loads(config) if config != "{}" else {}, bool(r["adding"]),
                    r["removing"], r["pending_release"],
                    Cause(r["pending_cause"]) if r["pending_cause"] else None)


def _fence(r: sqlite3.Row) -> Fence:
    return Fence(r["instance"], r["generation"], bool(r["held"]), r["reason"], r["updated_at"])
