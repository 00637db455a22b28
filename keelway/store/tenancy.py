"""The store's tenancy: apps created and forgotten, instances added and removed in
bulk, and the aliases (domains) of an instance. The rule of hosts these writes check is
keelway/store/hosts.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence

from keelway.journal import Cause
from keelway.store import identities
from keelway.store.base import Conflict, NotFound, StoreBase
from keelway.store.catalog import _app, _instance
from keelway.store.hosts import Claim, HostTaken, claim_of, mirror_aliases
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import GenState, InstanceState, Removal, RouteState
from keelway.store.records import Alias, App, Instance

__all__ = ["Claim", "HostTaken", "Removal", "Tenancy"]


class Tenancy(StoreBase):
    """Apps created and forgotten, instances added and removed, aliases."""

    def claim(self, host: str) -> Claim | None:
        return claim_of(self._conn, host)

    # -- apps ------------------------------------------------------------------------

    def create_app(self, name: str) -> App:
        """A new app with no config; `Conflict` if the name is taken."""
        with self.tx() as c:
            try:
                c.execute("INSERT INTO apps(name, created_at) VALUES (?, ?)",
                          (name, self.clock.now()))
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"an app named {name} exists") from exc
            uids, gids = identities.app_names(name)
            identities.allocate(c, IdSpace.UID, uids)
            identities.allocate(c, IdSpace.GID, gids)
        app = self._get_app(name)
        assert app is not None
        return app

    def mark_destroying(self, name: str, removal: Removal) -> None:
        """The durable intent of a destroy, written before its first effect: boot
        carries on an interrupted one. A purge asked once stays asked."""
        with self.tx() as c:
            cur = c.execute(
                "UPDATE apps SET destroying=CASE WHEN destroying=? THEN destroying ELSE ? END,"
                " version=version+1 WHERE name=?",
                (Removal.PURGE_DATA.value, removal.value, name))
            if cur.rowcount != 1:
                raise NotFound(f"app {name}")

    def destroying_apps(self) -> list[App]:
        rows = self._all("SELECT name FROM apps WHERE destroying IS NOT NULL ORDER BY name")
        return [a for a in (self._get_app(r[0]) for r in rows) if a is not None]

    def forget_app(self, name: str) -> None:
        """Delete the app's records (releases, builds, the app), so its name can be
        used again. Refused (`Conflict`) while it has an instance. The journal, the
        events and the idempotency keys stay: they say what happened, and a key never
        runs twice."""
        with self.tx() as c:
            left = self._one("SELECT COUNT(*) FROM instances WHERE app=?", name)
            if left is not None and int(left[0]):
                raise Conflict(f"app {name} still has {int(left[0])} instances")
            c.execute("DELETE FROM releases WHERE app=?", (name,))
            c.execute("DELETE FROM builds WHERE app=?", (name,))
            c.execute("DELETE FROM apps WHERE name=?", (name,))

    # -- instances ---------------------------------------------------------------------

    def add_instances(self, app: str, hosts: Sequence[str],
                      config: Mapping[str, str], parked: bool = False) -> list[Instance]:
        """Record new instances of `app`, all or none, each `adding` until its files are
        laid down and it has started (`finish_adding`). `HostTaken` (nothing written)
        if any host already names something; `NotFound` if there is no such app.

        `parked`: each is recorded PARKED with a `parked` route (the router holds its
        first request and asks for a wake) and the app's latest release deferred to
        that wake, in the same write."""
        now = self.clock.now()
        encoded = json.dumps(dict(config), sort_keys=True)
        with self.tx() as c:
            if self._one("SELECT 1 FROM apps WHERE name=? AND destroying IS NULL",
                         app) is None:
                raise NotFound(f"app {app}")
            for host in hosts:
                if (claim := claim_of(c, host)) is not None:
                    raise HostTaken(host, claim)
            state = InstanceState.PARKED if parked else InstanceState.RUNNING
            latest = self._one("SELECT MAX(number) FROM releases WHERE app=?", app)
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
        with self.tx() as c:
            c.executemany("UPDATE instances SET adding=0 WHERE host=?", [(h,) for h in hosts])

    def set_instance_config(self, inst: Instance, config: Mapping[str, str]) -> Instance:
        """Compare-and-swap on `inst.version`."""
        with self.tx() as c:
            cur = c.execute(
                "UPDATE instances SET config=?, version=version+1 WHERE host=? AND version=?",
                (json.dumps(dict(config), sort_keys=True), inst.host, inst.version))
            if cur.rowcount != 1:
                raise Conflict(f"instance {inst.host} changed under us")
        new = self._instances([inst.host])
        return new[0]

    def mark_removing(self, host: str, removal: Removal) -> None:
        """The durable intent of a removal, written before its operation begins: boot
        carries on an interrupted one. A purge asked once stays asked."""
        with self.tx() as c:
            cur = c.execute(
                "UPDATE instances SET removing=CASE WHEN removing=? THEN removing ELSE ? END,"
                " version=version+1 WHERE host=?",
                (Removal.PURGE_DATA.value, removal.value, host))
            if cur.rowcount != 1:
                raise NotFound(f"instance {host}")

    def withdraw_instance(self, host: str, removal: Removal) -> bool:
        """The first effect of a removal, in one write: the removal's durable intent,
        the instance STOPPED (so nothing restarts it), its routes (primary and aliases)
        gated. True if it had a route (the router must be told)."""
        with self.tx() as c:
            cur = c.execute(
                "UPDATE instances SET removing=CASE WHEN removing=? THEN removing ELSE ? END,"
                " state=?, version=version+1 WHERE host=?",
                (Removal.PURGE_DATA.value, removal.value, InstanceState.STOPPED.value, host))
            if cur.rowcount != 1:
                raise NotFound(f"instance {host}")
            routed = self._one("SELECT 1 FROM routes WHERE instance=?", host) is not None
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
        with self.tx() as c:
            live = self._one("SELECT COUNT(*) FROM generations WHERE instance=? AND state!=?",
                             host, GenState.GONE.value)
            if live is not None and int(live[0]):
                raise Conflict(f"{host} still has {int(live[0])} generations not proven gone")
            c.execute("DELETE FROM routes WHERE instance=?", (host,))
            c.execute("DELETE FROM aliases WHERE instance=?", (host,))
            c.execute("DELETE FROM active WHERE instance=?", (host,))
            c.execute("DELETE FROM backoff WHERE instance=?", (host,))
            gens = "SELECT id FROM generations WHERE instance=?"
            c.execute(f"DELETE FROM inhibitions WHERE generation_id IN ({gens})", (host,))
            c.execute(f"DELETE FROM port_claims WHERE generation_id IN ({gens})", (host,))
            c.execute("DELETE FROM generations WHERE instance=?", (host,))
            c.execute("DELETE FROM fences WHERE instance=?", (host,))
            c.execute("DELETE FROM instances WHERE host=?", (host,))

    def unfinished_operations(self) -> list[int]:
        """Ids of operations not yet terminal whose instance no longer exists (a
        removal that crashed after its records were deleted): nothing else finds them."""
        rows = self._all(
            "SELECT id FROM operations WHERE state='running' AND instance NOT IN"
            " (SELECT host FROM instances) ORDER BY id")
        return [int(r[0]) for r in rows]

    # -- aliases -----------------------------------------------------------------------

    def add_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]:
        """More hosts of `instance`, all or none, routed as its primary is, in the same
        write. An alias it already has is kept; `HostTaken` if a host names anything
        else, `NotFound` if there is no such instance."""
        now = self.clock.now()
        with self.tx() as c:
            if self._one("SELECT 1 FROM instances WHERE host=?", instance) is None:
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
        with self.tx() as c:
            for host in hosts:
                if self._one("SELECT 1 FROM aliases WHERE host=? AND instance=?",
                             host, instance) is None:
                    raise NotFound(f"{host} is not an alias of {instance}")
            c.executemany("DELETE FROM routes WHERE host=? AND instance=?",
                          [(h, instance) for h in hosts])
            c.executemany("DELETE FROM aliases WHERE host=?", [(h,) for h in hosts])
        return self.list_aliases(instance)

    def list_aliases(self, instance: str | None = None) -> list[Alias]:
        rows = (self._all("SELECT * FROM aliases ORDER BY host") if instance is None else
                self._all("SELECT * FROM aliases WHERE instance=? ORDER BY host", instance))
        return [Alias(r["host"], r["instance"], r["created_at"]) for r in rows]

    # -- reads -------------------------------------------------------------------------

    def _get_app(self, name: str) -> App | None:
        row = self._one("SELECT * FROM apps WHERE name=?", name)
        return _app(row) if row else None

    def _instances(self, hosts: Sequence[str]) -> list[Instance]:
        """The instances named, in the order given (500 hosts a query: under SQLite's
        limit of bound variables)."""
        found: dict[str, Instance] = {}
        for start in range(0, len(hosts), 500):
            chunk = list(hosts[start:start + 500])
            marks = ",".join("?" * len(chunk))
            for row in self._all(f"SELECT * FROM instances WHERE host IN ({marks})", *chunk):
                found[row["host"]] = _instance(row)
        return [found[h] for h in hosts if h in found]

    def _instances_where(self, where: str) -> list[Instance]:
        rows = self._all(f"SELECT * FROM instances WHERE {where} ORDER BY host")
        return [_instance(r) for r in rows]
