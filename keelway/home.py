"""Where everything lives under $KEELWAY_HOME; the one place that names paths.

Nothing else builds paths under the home by hand, so the layout can be read here whole.

Nothing under the home is readable by group or other, with no exception: the home and
its directories are 0700 (when tenants run as uids of their own, the few they pass
through are 0711: searchable, never listable; keelway/identity.py), files 0600
(builds: 0700 for an executable, and a sealed build drops the write bits). The store
and its `-wal`/`-shm` hold config values, the env files instance keys, the data dirs
tenants' databases, builds the app's source. The daemon
runs with umask 0077, so what it and its children (router, build steps, apps) create is
owner-only from the first instant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Instance hosts name directories and files below. Only names that keelway/names.py's
# HOST rule accepts ever get here (the API and the deployer check them first), and each
# of those is one safe path component: no `/`, never `.` or `..`.


# What a process keelway starts runs with (the daemon sets it at start, and children
# inherit it): files 0600, directories 0700, whatever the code creating them asks for.
PRIVATE_UMASK = 0o077
PRIVATE_DIR_MODE = 0o700
# The directories tenants' uids pass through when each tenant has a uid of its own.
TENANT_DIR_MODE = 0o711
_SUBDIRS = ("logs", "logs/apps", "router", "builds", "data", "env", "current", "run",
            "certs")


def default_root() -> Path:
    """$KEELWAY_HOME; else, for root, /var/lib/keelway (root's own home is 0700, so no
    tenant's uid could reach a home inside it: keelway/identity.py); else
    ~/.local/share/keelway."""
    env = os.environ.get("KEELWAY_HOME")
    if env:
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/lib/keelway")
    return Path.home() / ".local" / "share" / "keelway"


class _Under:
    """A fixed path of the home, `root / parts`, read as an attribute of a Home: the
    layout is one table of names below, and nothing joins the parts by hand."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, home: Home, owner: type[Home]) -> Path:
        return home.root.joinpath(*self.parts)


@dataclass(frozen=True)
class Home:
    root: Path

    store_path = _Under("keelway.db")
    api_socket = _Under("api.sock")
    # Where `keelway run` lends the daemon its terminal (keelway/run_wire.py).
    run_socket = _Under("run.sock")
    lock_path = _Under("keelway.lock")
    daemon_log = _Under("logs", "keelway.log")
    router_dir = _Under("router")
    router_socket = _Under("router", "control.sock")
    router_state = _Under("router", "routes.json")
    router_pidfile = _Under("router", "router.pid")
    # What the running router was started with: its address, workers, trusted proxies.
    router_settings = _Under("router", "settings.json")
    router_log = _Under("logs", "router.log")
    builds_dir = _Under("builds")
    # Seeds' verified copies, by seed id (keelway/data/seed.py).
    seeds_dir = _Under("objects", "seeds")
    # The default object store (snapshots and their manifests).
    objects_dir = _Under("objects")
    # The certificates the router serves HTTPS with: NAME/fullchain.pem and privkey.pem
    # (keelway/router/tls.py reads them; keelway/certs.py lays them down).
    certs_dir = _Under("certs")
    # The object store `keelway up --objects` named, kept for the next `up`.
    objects_setting = _Under("objects.url")
    # Where `keelway up --admin` serves /metrics and the dashboard, kept for the next `up`.
    admin_setting = _Under("admin.addr")

    @classmethod
    def from_env(cls) -> Home:
        return cls(default_root())

    def data_dir(self, instance: str) -> Path:
        return self.root / "data" / instance

    def db_path(self, instance: str) -> Path:
        return self.data_dir(instance) / "db.sqlite3"

    def seed_copy(self, seed: str) -> Path:
        return self.seeds_dir / f"{seed}.db"

    def seed_db_path(self, instance: str) -> Path:
        """Where a seed import lays its database down: nested in the instance's data
        dir, beside and never over the instance's own database."""
        return self.data_dir(instance) / "seed" / "db.sqlite3"

    def env_file(self, instance: str) -> Path:
        return self.root / "env" / f"{instance}.env"

    def current_link(self, instance: str) -> Path:
        """A symlink to the build the instance serves, so an operator can see what runs."""
        return self.root / "current" / instance

    def notify_socket(self, generation: int) -> Path:
        return self.root / "run" / f"notify-{generation}.sock"

    def log_dir(self, instance: str) -> Path:
        return self.root / "logs" / "apps" / instance

    def ensure(self) -> None:
        """Lay the home's directories down, each 0700 from its creation.

        A home laid down by an older keelway (0755 directories) is narrowed here; that
        chmod is a one-time upgrade, not how a new directory gets its mode. The search
        bit that `open_to_tenants` gives is left alone: running tenants depend on it.
        """
        self.root.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        for path in (self.root, *(self.root / sub for sub in _SUBDIRS)):
            path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
            allowed = TENANT_DIR_MODE if path in self.tenant_traversed else PRIVATE_DIR_MODE
            if path.stat().st_mode & 0o777 & ~allowed:
                os.chmod(path, PRIVATE_DIR_MODE)

    @property
    def tenant_traversed(self) -> tuple[Path, ...]:
        """The directories a tenant's uid passes through, to its build, its data dir, its
        env file and its notify socket: searchable by all, listable by none."""
        return (self.root, self.builds_dir, self.root / "data", self.root / "env",
                self.root / "run")

    def open_to_tenants(self) -> None:
        """Let tenants' uids pass through (`tenant_traversed`); nothing becomes listable,
        and every other directory stays 0700 (keelway/identity.py)."""
        for path in self.tenant_traversed:
            os.chmod(path, TENANT_DIR_MODE)
