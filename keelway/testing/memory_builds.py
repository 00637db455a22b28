"""The in-memory store's builds and releases (BuildStore)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from keelway.journal import REPLICA
from keelway.store.errors import NotFound
from keelway.store.lifecycle import GenState
from keelway.store.records import Build, Release
from keelway.testing.memory_tables import MemoryDb, MemoryTables, own, own_or_none, owned_where


class MemoryBuilds:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def record_build(self, app: str, digest: str, path: str,
                     source: dict[str, str] | None = None) -> Build:
        with self._db.write() as t:
            have = t.builds.get((app, digest))
            if have is None:
                t.builds[(app, digest)] = Build(app, digest, path, False,
                                                self._db.clock.now(), _sorted(source))
            elif source is not None:
                t.builds[(app, digest)] = msgspec.structs.replace(have,
                                                                  source=_sorted(source))
            return own(t.builds[(app, digest)])

    def mark_build_good(self, app: str, digest: str) -> None:
        with self._db.write() as t:
            if (have := t.builds.get((app, digest))) is not None:
                t.builds[(app, digest)] = msgspec.structs.replace(have, good=True)

    def list_builds(self, app: str | None = None) -> list[Build]:
        # Oldest first per app; builds recorded at one instant keep the order recorded.
        return owned_where(self._db.tables.builds, lambda b: app is None or b.app == app,
                           lambda b: (b.app, b.created_at))

    def forget_build(self, app: str, digest: str) -> None:
        with self._db.write() as t:
            t.builds.pop((app, digest), None)

    def pinned_builds(self, keep: Mapping[str, int] | None = None) -> set[tuple[str, str]]:
        """As the SQLite store's (keelway/store/catalog.py says why each is pinned)."""
        t = self._db.tables
        pinned = {(g.app, g.build_digest) for g in t.generations.values()
                  if g.state is not GenState.GONE and g.service != REPLICA}
        pinned |= {(g.app, g.build_digest) for a in t.active.values()
                   if (g := t.generations.get(a.generation_id)) is not None}
        pinned |= {(r.app, r.build_digest) for i in t.instances.values()
                   if i.pending_release is not None
                   and (r := t.releases.get((i.app, i.pending_release))) is not None}
        good = {key for key, b in t.builds.items() if b.good}
        seen: dict[str, int] = {}
        good_seen: dict[str, set[str]] = {}
        for (app, _), r in sorted(t.releases.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
            seen[app] = seen.get(app, 0) + 1
            if keep is None or app not in keep or seen[app] <= keep[app]:
                pinned.add((app, r.build_digest))
            goods = good_seen.setdefault(app, set())
            if (app, r.build_digest) in good and len(goods) < 2:
                goods.add(r.build_digest)
                pinned.add((app, r.build_digest))
        return pinned

    def create_release(self, app: str, build_digest: str, config: dict[str, str],
                       description: str) -> Release:
        with self._db.write() as t:
            return own(create_release(t, app, build_digest, config, description,
                                      self._db.clock.now()))

    def next_release_number(self, app: str) -> int:
        return _next_number(self._db.tables, app)

    def list_releases(self, app: str) -> list[Release]:
        return owned_where(self._db.tables.releases, lambda r: r.app == app,
                           lambda r: -r.number)

    def get_release(self, app: str, number: int) -> Release | None:
        return own_or_none(self._db.tables.releases.get((app, number)))


def create_release(t: MemoryTables, app: str, build_digest: str, config: dict[str, str],
                   description: str, now: float) -> Release:
    """The app's next release, with its build's source as of now, inside a write."""
    if app not in t.apps:
        raise NotFound(f"create a release of {app}: no app {app}")
    build = t.builds.get((app, build_digest))
    release = Release(app, _next_number(t, app), build_digest, dict(config), description,
                      now, dict(build.source) if build and build.source is not None else None)
    t.releases[(app, release.number)] = release
    return release


def _next_number(t: MemoryTables, app: str) -> int:
    return max((n for (a, n) in t.releases if a == app), default=0) + 1


def _sorted(source: dict[str, str] | None) -> dict[str, str] | None:
    return dict(sorted(source.items())) if source is not None else None
