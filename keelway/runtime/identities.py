"""Which identity each process of a home runs as, and the files that are made its own.

The rule (keelway/identity.py says why) is applied at one place, the spawn of a tenant's
generation (`for_spawn`): whatever path created the instance's files (an add, a deploy,
a restore's swap, a seed's lay-down, all done by root), they are its own again before
any process of it runs, and its build is readable by its app's group. Idempotent: a
crash between a file's creation and its hand-over leaves a root-owned file that the
next spawn hands over, and nothing of the instance runs meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from keelway import identity
from keelway.durable import sqlite_side_paths
from keelway.home import Home
from keelway.identity import Identity
from keelway.store import Store
from keelway.store.identities import IdSpace, instance_name
from keelway.store.records import Generation

_DIR = 0o700
_FILE = 0o600


class Identities:
    def __init__(self, store: Store, home: Home) -> None:
        self.store = store
        self.home = home
        # Why tenants share keelway's uid, or None when each has its own: fixed for the
        # life of a control plane (the box and the home do not change under it).
        self.shared_because = identity.in_force(home.root)

    @property
    def in_force(self) -> bool:
        return self.shared_because is None

    def of_instance(self, app: str, host: str) -> Identity | None:
        if not self.in_force:
            return None
        return Identity.numbered(self.store.instances.identity_number(IdSpace.UID,
                                                                      instance_name(host)),
                                 self.store.instances.identity_number(IdSpace.GID, f"app:{app}"))

    def builder(self, app: str) -> Identity | None:
        """Who runs the build command of `app`: a uid of the app's own, in its group."""
        if not self.in_force:
            return None
        return Identity.numbered(self.store.instances.identity_number(IdSpace.UID, f"build:{app}"),
                                 self.store.instances.identity_number(IdSpace.GID, f"app:{app}"))

    def for_spawn(self, gen: Generation, build: Path) -> Identity | None:
        """The identity `gen` runs as, with its instance's files made its own and its
        build readable by its group; None where identities are not in force."""
        ident = self.of_instance(gen.app, gen.instance)
        if ident is None:
            return None
        self.own_instance_files(gen.instance, ident)
        identity.own(self.home.notify_socket(gen.id), ident, _FILE)
        if build.parent.parent == self.home.builds_dir:
            if not identity.shared_with(build, ident.gid):
                identity.share_with_group(build, ident.gid)
            identity.open_app_builds(build.parent, ident.gid)
        return ident

    def instance_files(self, host: str) -> list[tuple[Path, int]]:
        """The files keelway makes for an instance, each with its mode: its data dir, its
        database and the one a seed import lays down (each with SQLite's side files),
        and its env file. What the app itself creates is its own already."""
        files = [(self.home.data_dir(host), _DIR), (self.home.seed_db_path(host).parent, _DIR)]
        for db in (self.home.db_path(host), self.home.seed_db_path(host)):
            files += [(path, _FILE) for path in (db, *sqlite_side_paths(db))]
        return [*files, (self.home.env_file(host), _FILE)]

    def own_instance_files(self, host: str, ident: Identity) -> None:
        """`instance_files`, owned by the instance's uid."""
        data = self.home.data_dir(host)
        try:
            moved = data.stat().st_uid != ident.uid
        except FileNotFoundError:
            moved = False
        if moved:
            # First spawn as its own uid (a box where tenants shared keelway's uid until
            # now, or a data dir an older keelway made): what the app wrote is its own too.
            identity.own_tree(data, ident)
        for path, mode in self.instance_files(host):
            identity.own(path, ident, mode)

    def files_not_owned(self, app: str, host: str) -> list[str]:
        """Those of `instance_files` that exist and are not the instance's (the crash
        matrix's invariant); [] where identities are not in force."""
        ident = self.of_instance(app, host)
        if ident is None:
            return []
        wrong = []
        for path, _mode in self.instance_files(host):
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if info.st_uid != ident.uid:
                wrong.append(f"{path} is owned by uid {info.st_uid}, not {ident.uid}")
        return wrong
