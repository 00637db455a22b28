"""Where everything lives under $KEELWAY_HOME; the one place that names paths.

Nothing else builds paths under the home by hand, so the layout can be read here whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Instance hosts name directories and files below. Only names that keelway/names.py's
# HOST rule accepts ever get here (the API and the deployer check them first), and each
# of those is one safe path component: no `/`, never `.` or `..`.


def default_root() -> Path:
    env = os.environ.get("KEELWAY_HOME")
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".local" / "share" / "keelway"


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def from_env(cls) -> Home:
        return cls(default_root())

    @property
    def store_path(self) -> Path:
        return self.root / "keelway.db"

    @property
    def api_socket(self) -> Path:
        return self.root / "api.sock"

    @property
    def lock_path(self) -> Path:
        return self.root / "keelway.lock"

    @property
    def daemon_log(self) -> Path:
        return self.root / "logs" / "keelway.log"

    @property
    def router_dir(self) -> Path:
        return self.root / "router"

    @property
    def router_socket(self) -> Path:
        return self.root / "router" / "control.sock"

    @property
    def router_state(self) -> Path:
        return self.root / "router" / "routes.json"

    @property
    def router_pidfile(self) -> Path:
        return self.root / "router" / "router.pid"

    @property
    def router_settings(self) -> Path:
        """What the running router was started with: its address, workers, trusted proxies."""
        return self.root / "router" / "settings.json"

    @property
    def router_log(self) -> Path:
        return self.root / "logs" / "router.log"

    @property
    def builds_dir(self) -> Path:
        return self.root / "builds"

    def data_dir(self, instance: str) -> Path:
        return self.root / "data" / instance

    def db_path(self, instance: str) -> Path:
        return self.data_dir(instance) / "db.sqlite3"

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
        for sub in ("", "logs", "logs/apps", "router", "builds", "data", "env", "current",
                    "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # The env files hold instance keys: nobody else may list or read them.
        os.chmod(self.root / "env", 0o700)
