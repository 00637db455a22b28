"""The SQLite store's apps: created (or ensured), configured, marked destroying, forgotten."""

from __future__ import annotations

import json
import sqlite3

from keelway.store import identities
from keelway.store.db import Db, mark_removal, swap
from keelway.store.errors import Conflict, NotFound
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import Removal
from keelway.store.records import App


class SqliteApps:
    """Apps and their config (`AppStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def get_app(self, name: str) -> App | None:
        return self.db.first(app_of, "SELECT * FROM apps WHERE name=?", name)

    def list_apps(self) -> list[App]:
        return [app_of(r) for r in self.db.select("apps", order="name")]

    def ensure_app(self, name: str) -> App:
        with self.db.tx(f"ensure app {name}") as c:
            c.execute(
                "INSERT INTO apps(name, created_at) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                (name, self.db.clock.now()),
            )
            _allocate_app(c, name)
            app = self.get_app(name)
        assert app is not None  # just inserted inside this transaction
        return app

    def set_app_config(self, app: App, config: dict[str, str]) -> App:
        with self.db.tx(f"set the config of app {app.name}") as c:
            swap(c, "apps", {"name": app.name}, app.version, f"app {app.name} changed under us",
                 config=json.dumps(config, sort_keys=True))
            new = self.get_app(app.name)
        assert new is not None
        return new

    def create_app(self, name: str) -> App:
        """A new app with no config; `Conflict` if the name is taken."""
        with self.db.tx(f"create app {name}") as c:
            try:
                c.execute("INSERT INTO apps(name, created_at) VALUES (?, ?)",
                          (name, self.db.clock.now()))
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"an app named {name} exists") from exc
            _allocate_app(c, name)
        app = self.get_app(name)
        assert app is not None
        return app

    def mark_destroying(self, name: str, removal: Removal) -> None:
        """The durable intent of a destroy, written before its first effect: boot
        carries on an interrupted one. A purge asked once stays asked."""
        with self.db.tx(f"mark app {name} destroying") as c:
            if not mark_removal(c, "apps", "destroying", "name", name, removal):
                raise NotFound(f"app {name}")

    def destroying_apps(self) -> list[App]:
        return [app_of(r) for r in self.db.select("apps", where="destroying IS NOT NULL",
                                                   order="name")]

    def forget_app(self, name: str) -> None:
        """Delete the app's records (releases, builds, the app), so its name can be
        used again. Refused (`Conflict`) while it has an instance. The journal, the
        events and the idempotency keys stay: they say what happened, and a key never
        runs twice."""
        with self.db.tx(f"forget app {name}") as c:
            left = self.db.row("SELECT COUNT(*) FROM instances WHERE app=?", name)
            if left is not None and int(left[0]):
                raise Conflict(f"app {name} still has {int(left[0])} instances")
            c.execute("DELETE FROM releases WHERE app=?", (name,))
            c.execute("DELETE FROM builds WHERE app=?", (name,))
            c.execute("DELETE FROM apps WHERE name=?", (name,))


def _allocate_app(c: sqlite3.Connection, name: str) -> None:
    """An app is written with its identity numbers, in the same write."""
    uids, gids = identities.app_names(name)
    identities.allocate(c, IdSpace.UID, uids)
    identities.allocate(c, IdSpace.GID, gids)


def app_of(r: sqlite3.Row) -> App:
    return App(r["name"], json.loads(r["config"]), r["created_at"], r["version"],
               r["destroying"])
