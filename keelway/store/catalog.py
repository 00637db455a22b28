"""The store's catalog: apps, their instances, builds and releases."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from keelway.journal import REPLICA, Cause
from keelway.store import identities
from keelway.store.base import Conflict, NotFound, StoreBase
from keelway.store.hosts import refuse_claimed
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import InstanceState, check
from keelway.store.records import App, Build, Instance, Release


class Catalog(StoreBase):
    """Apps, instances, builds and releases."""

    # -- apps and instances ----------------------------------------------------------

    def get_app(self, name: str) -> App | None:
        row = self._one("SELECT * FROM apps WHERE name=?", name)
        return _app(row) if row else None

    def list_apps(self) -> list[App]:
        return [_app(r) for r in self._all("SELECT * FROM apps ORDER BY name")]

    def ensure_app(self, name: str) -> App:
        with self.tx() as c:
            c.execute(
                "INSERT INTO apps(name, created_at) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                (name, self.clock.now()),
            )
            uids, gids = identities.app_names(name)
            identities.allocate(c, IdSpace.UID, uids)
            identities.allocate(c, IdSpace.GID, gids)
            app = self.get_app(name)
        assert app is not None  # just inserted inside this transaction
        return app

    def set_app_config(self, app: App, config: dict[str, str]) -> App:
        with self.tx() as c:
            cur = c.execute(
                "UPDATE apps SET config=?, version=version+1 WHERE name=? AND version=?",
                (json.dumps(config, sort_keys=True), app.name, app.version),
            )
            if cur.rowcount != 1:
                raise Conflict(f"app {app.name} changed under us")
            new = self.get_app(app.name)
        assert new is not None
        return new

    def get_instance(self, host: str) -> Instance | None:
        row = self._one("SELECT * FROM instances WHERE host=?", host)
        return _instance(row) if row else None

    def list_instances(self, app: str | None = None) -> list[Instance]:
        if app is None:
            rows = self._all("SELECT * FROM instances ORDER BY app, host")
        else:
            rows = self._all("SELECT * FROM instances WHERE app=? ORDER BY host", app)
        return [_instance(r) for r in rows]

    def ensure_instance(self, host: str, app: str) -> Instance:
        with self.tx() as c:
            refuse_claimed(c, host, app)
            c.execute(
                "INSERT INTO instances(host, app, state, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(host) DO NOTHING",
                (host, app, InstanceState.RUNNING.value, self.clock.now()),
            )
            identities.allocate(c, IdSpace.UID, [identities.instance_name(host)])
            inst = self.get_instance(host)
        assert inst is not None
        return inst

    def set_instance_state(self, inst: Instance, state: InstanceState,
                           down_reason: str | None = None) -> Instance:
        check(inst.state, state)  # the caller's copy: a stale one loses the swap anyway
        with self.tx() as c:
            cur = c.execute(
                "UPDATE instances SET state=?, down_reason=?, version=version+1"
                " WHERE host=? AND version=?",
                (state.value, down_reason, inst.host, inst.version),
            )
            if cur.rowcount != 1:
                raise Conflict(f"instance {inst.host} changed under us")
            new = self.get_instance(inst.host)
        assert new is not None
        return new

    def bump_schedule(self, host: str) -> int:
        """Advance the instance's schedule revision; attempts holding an older one are stale."""
        with self.tx() as c:
            c.execute(
                "UPDATE instances SET schedule_rev=schedule_rev+1 WHERE host=?",
                (host,),
            )
            row = self._one("SELECT schedule_rev FROM instances WHERE host=?", host)
        if row is None:
            raise NotFound(f"instance {host}")
        return int(row["schedule_rev"])

    # -- builds and releases ---------------------------------------------------------

    def record_build(self, app: str, digest: str, path: str,
                     source: dict[str, str] | None = None) -> Build:
        with self.tx() as c:
            c.execute(
                "INSERT INTO builds(app, digest, path, created_at, source) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(app, digest) DO UPDATE SET"
                " source=COALESCE(excluded.source, builds.source)",
                (app, digest, path, self.clock.now(),
                 json.dumps(source, sort_keys=True) if source is not None else None),
            )
            row = self._one("SELECT * FROM builds WHERE app=? AND digest=?", app, digest)
        assert row is not None
        return _build(row)

    def mark_build_good(self, app: str, digest: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE builds SET good=1 WHERE app=? AND digest=?", (app, digest))

    def list_builds(self, app: str | None = None) -> list[Build]:
        if app is None:
            rows = self._all("SELECT * FROM builds ORDER BY app, created_at")
        else:
            rows = self._all("SELECT * FROM builds WHERE app=? ORDER BY created_at", app)
        return [_build(r) for r in rows]

    def forget_build(self, app: str, digest: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM builds WHERE app=? AND digest=?", (app, digest))

    def pinned_builds(self, keep: Mapping[str, int] | None = None) -> set[tuple[str, str]]:
        """Builds that gc must keep. With no `keep`: every one a release names. With
        `keep` (releases kept per app, from each app's `[releases] keep`): the builds of
        an app's newest `keep[app]` releases (every release of an app not in it), of its
        two newest releases on a good build (a fallback skips the build being deployed,
        so the one before must stay), of a release deferred to a parked instance, of
        every generation ACTIVE names (a parked instance's too) and of any generation
        not gone (in-flight attempts). A replicator's generation pins nothing: it runs
        keelway's own program in the data dir, and carries its web's build as a label
        only, which after a redeploy would pin the first build for as long as it runs."""
        pinned = {(r[0], r[1]) for r in self._all(
            "SELECT app, build_digest FROM generations WHERE state != 'gone' "
            "AND service != ? "
            "UNION SELECT g.app, g.build_digest FROM active a "
            "JOIN generations g ON g.id = a.generation_id "
            "UNION SELECT r.app, r.build_digest FROM instances i "
            "JOIN releases r ON r.app = i.app AND r.number = i.pending_release", REPLICA)}
        good = {(r[0], r[1]) for r in self._all(
            "SELECT app, digest FROM builds WHERE good = 1")}
        seen: dict[str, int] = {}
        good_seen: dict[str, set[str]] = {}
        for app, digest in self._all(
                "SELECT app, build_digest FROM releases ORDER BY app, number DESC"):
            seen[app] = seen.get(app, 0) + 1
            if keep is None or app not in keep or seen[app] <= keep[app]:
                pinned.add((app, digest))
            goods = good_seen.setdefault(app, set())
            if (app, digest) in good and len(goods) < 2:
                goods.add(digest)
                pinned.add((app, digest))
        return pinned

    def create_release(
        self, app: str, build_digest: str, config: dict[str, str], description: str
    ) -> Release:
        with self.tx() as c:
            row = self._one("SELECT MAX(number) AS n FROM releases WHERE app=?", app)
            number = (row["n"] or 0) + 1 if row else 1
            # The build's source as of now, in the same write (see schema migration 9).
            c.execute(
                "INSERT INTO releases(app, number, build_digest, config, description,"
                " created_at, source) VALUES (?, ?, ?, ?, ?, ?,"
                " (SELECT source FROM builds WHERE app=? AND digest=?))",
                (app, number, build_digest, json.dumps(config), description, self.clock.now(),
                 app, build_digest),
            )
        written = self.get_release(app, number)
        assert written is not None
        return written

    def next_release_number(self, app: str) -> int:
        row = self._one("SELECT MAX(number) AS n FROM releases WHERE app=?", app)
        return int(row["n"] or 0) + 1 if row else 1

    def list_releases(self, app: str) -> list[Release]:
        rows = self._all("SELECT * FROM releases WHERE app=? ORDER BY number DESC", app)
        return [_release(r) for r in rows]

    def get_release(self, app: str, number: int) -> Release | None:
        row = self._one("SELECT * FROM releases WHERE app=? AND number=?", app, number)
        return _release(row) if row else None


def _app(r: sqlite3.Row) -> App:
    return App(r["name"], json.loads(r["config"]), r["created_at"], r["version"],
               r["destroying"])


def _instance(r: sqlite3.Row) -> Instance:
    return Instance(r["host"], r["app"], InstanceState(r["state"]), r["fence"],
                    r["schedule_rev"], r["created_at"], r["version"], r["down_reason"],
                    json.loads(r["config"]), bool(r["adding"]), r["removing"],
                    r["pending_release"],
                    Cause(r["pending_cause"]) if r["pending_cause"] else None)


def _build(r: sqlite3.Row) -> Build:
    return Build(r["app"], r["digest"], r["path"], bool(r["good"]), r["created_at"],
                 _source(r["source"]))


def _release(r: sqlite3.Row) -> Release:
    return Release(r["app"], r["number"], r["build_digest"], json.loads(r["config"]),
                   r["description"], r["created_at"], _source(r["source"]))


def _source(text: str | None) -> dict[str, str] | None:
    return json.loads(text) if text else None
