"""The SQLite store's builds and the releases made of them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from keelway.journal import REPLICA
from keelway.store.db import Db
from keelway.store.records import Build, Release


class SqliteBuilds:
    """Builds and releases (`BuildStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def record_build(self, app: str, digest: str, path: str,
                     source: dict[str, str] | None = None) -> Build:
        with self.db.tx(f"record build {digest[:12]} of {app}",
                        missing=f"no app {app}") as c:
            c.execute(
                "INSERT INTO builds(app, digest, path, created_at, source) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(app, digest) DO UPDATE SET"
                " source=COALESCE(excluded.source, builds.source)",
                (app, digest, path, self.db.clock.now(),
                 json.dumps(source, sort_keys=True) if source is not None else None),
            )
            row = self.db.row("SELECT * FROM builds WHERE app=? AND digest=?", app, digest)
        assert row is not None
        return _build(row)

    def mark_build_good(self, app: str, digest: str) -> None:
        with self.db.tx(f"mark build {digest[:12]} of {app} good") as c:
            c.execute("UPDATE builds SET good=1 WHERE app=? AND digest=?", (app, digest))

    def list_builds(self, app: str | None = None) -> list[Build]:
        return [_build(r) for r in self.db.select("builds", order="app, created_at", app=app)]

    def forget_build(self, app: str, digest: str) -> None:
        with self.db.tx(f"forget build {digest[:12]} of {app}") as c:
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
        pinned = {(r[0], r[1]) for r in self.db.rows(
            "SELECT app, build_digest FROM generations WHERE state != 'gone' "
            "AND service != ? "
            "UNION SELECT g.app, g.build_digest FROM active a "
            "JOIN generations g ON g.id = a.generation_id "
            "UNION SELECT r.app, r.build_digest FROM instances i "
            "JOIN releases r ON r.app = i.app AND r.number = i.pending_release", REPLICA)}
        good = {(r[0], r[1]) for r in self.db.rows(
            "SELECT app, digest FROM builds WHERE good = 1")}
        seen: dict[str, int] = {}
        good_seen: dict[str, set[str]] = {}
        for app, digest in self.db.rows(
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
        with self.db.tx(f"create a release of {app}", missing=f"no app {app}") as c:
            row = self.db.row("SELECT MAX(number) AS n FROM releases WHERE app=?", app)
            number = (row["n"] or 0) + 1 if row else 1
            # The build's source as of now, in the same write (see schema migration 9).
            c.execute(
                "INSERT INTO releases(app, number, build_digest, config, description,"
                " created_at, source) VALUES (?, ?, ?, ?, ?, ?,"
                " (SELECT source FROM builds WHERE app=? AND digest=?))",
                (app, number, build_digest, json.dumps(config), description,
                 self.db.clock.now(), app, build_digest),
            )
        written = self.get_release(app, number)
        assert written is not None
        return written

    def next_release_number(self, app: str) -> int:
        row = self.db.row("SELECT MAX(number) AS n FROM releases WHERE app=?", app)
        return int(row["n"] or 0) + 1 if row else 1

    def list_releases(self, app: str) -> list[Release]:
        return [_release(r) for r in self.db.select("releases", order="number DESC", app=app)]

    def get_release(self, app: str, number: int) -> Release | None:
        return self.db.first(_release, "SELECT * FROM releases WHERE app=? AND number=?",
                             app, number)


def _build(r: sqlite3.Row) -> Build:
    return Build(r["app"], r["digest"], r["path"], bool(r["good"]), r["created_at"],
                 _source(r["source"]))


def _release(r: sqlite3.Row) -> Release:
    return Release(r["app"], r["number"], r["build_digest"], json.loads(r["config"]),
                   r["description"], r["created_at"], _source(r["source"]))


def _source(text: str | None) -> dict[str, str] | None:
    return json.loads(text) if text else None
