"""The in-memory store's apps (AppStore): created, configured, destroyed, forgotten."""

from __future__ import annotations

import msgspec

from keelway.store.errors import Conflict, NotFound
from keelway.store.identities import IdSpace, app_names
from keelway.store.lifecycle import Removal
from keelway.store.records import App
from keelway.testing.memory_instances import allocate, kept_removal
from keelway.testing.memory_tables import MemoryDb, MemoryTables, own, own_or_none, owned_by_key


class MemoryApps:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def get_app(self, name: str) -> App | None:
        return own_or_none(self._db.tables.apps.get(name))

    def list_apps(self) -> list[App]:
        return owned_by_key(self._db.tables.apps)

    def ensure_app(self, name: str) -> App:
        with self._db.write() as t:
            if name not in t.apps:
                _insert(t, name, self._db.clock.now())
            return own(t.apps[name])

    def set_app_config(self, app: App, config: dict[str, str]) -> App:
        with self._db.write() as t:
            have = t.apps.get(app.name)
            if have is None or have.version != app.version:
                raise Conflict(f"app {app.name} changed under us")
            t.apps[app.name] = msgspec.structs.replace(
                have, config=dict(sorted(config.items())), version=have.version + 1)
            return own(t.apps[app.name])

    def create_app(self, name: str) -> App:
        with self._db.write() as t:
            if name in t.apps:
                raise Conflict(f"an app named {name} exists")
            _insert(t, name, self._db.clock.now())
            return own(t.apps[name])

    def mark_destroying(self, name: str, removal: Removal) -> None:
        with self._db.write() as t:
            have = t.apps.get(name)
            if have is None:
                raise NotFound(f"app {name}")
            t.apps[name] = msgspec.structs.replace(
                have, destroying=kept_removal(have.destroying, removal), version=have.version + 1)

    def destroying_apps(self) -> list[App]:
        return [a for a in self.list_apps() if a.destroying is not None]

    def forget_app(self, name: str) -> None:
        with self._db.write() as t:
            left = sum(1 for i in t.instances.values() if i.app == name)
            if left:
                raise Conflict(f"app {name} still has {left} instances")
            for number in [n for (a, n) in t.releases if a == name]:
                del t.releases[(name, number)]
            for digest in [d for (a, d) in t.builds if a == name]:
                del t.builds[(name, digest)]
            t.apps.pop(name, None)


def _insert(t: MemoryTables, name: str, now: float) -> None:
    t.apps[name] = App(name, {}, now, 1)
    uids, gids = app_names(name)
    allocate(t, IdSpace.UID, uids)
    allocate(t, IdSpace.GID, gids)
