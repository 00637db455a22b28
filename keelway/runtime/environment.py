"""The environment of a generation (SPEC §3), and the instance env file with its key.

The env file holds the instance key, a secret: it is written 0600 through
durable.write_atomic and its values never leave this module except into the child's
environment. Nothing here logs a value.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from keelway.app_path import app_path
from keelway.durable import write_atomic
from keelway.home import Home

INSTANCE_KEY = "KEELWAY_INSTANCE_KEY"
_PASSED_THROUGH = ("LANG", "LC_ALL", "TZ")


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return values
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = value
    return values


def write_env_file(path: Path, values: dict[str, str]) -> None:
    body = "".join(f"{k}={v}\n" for k, v in sorted(values.items()))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, body.encode(), mode=0o600)


def ensure_instance_key(path: Path) -> bool:
    """Mint the instance key into the env file unless one is there; True if minted."""
    values = read_env_file(path)
    if values.get(INSTANCE_KEY):
        return False
    values[INSTANCE_KEY] = secrets.token_urlsafe(32)
    write_env_file(path, values)
    return True


def process_env(
    *, home: Home, app: str, instance: str, service: str, release: int, generation: int,
    port: int | None, config: dict[str, str], build_path: Path,
) -> dict[str, str]:
    """The whole environment of one generation; nothing of the control plane's leaks in:
    not its PATH (keelway.app_path), not its HOME (an app's HOME is its instance's data
    dir, which it owns and keeps across releases)."""
    env = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
    env.update(
        PATH=app_path(build_path),
        HOME=str(home.data_dir(instance)),
        PYTHONUNBUFFERED="1",
    )
    env.update(config)
    db = home.db_path(instance)
    env.update(
        KEELWAY_APP=app,
        KEELWAY_INSTANCE=instance,
        KEELWAY_SERVICE=service,
        KEELWAY_RELEASE=f"v{release}",
        KEELWAY_GENERATION=str(generation),
        KEELWAY_DATA_DIR=str(home.data_dir(instance)),
        KEELWAY_DB=str(db),
        DATABASE_URL=f"sqlite:///{db}",
        # Marks the process as ours, so a scan of /proc can find a generation that was
        # spawned but whose pid the journal never recorded (crash between the two).
        KEELWAY_SUPERVISOR=str(home.root),
    )
    env["NOTIFY_SOCKET"] = str(home.notify_socket(generation))
    if port is not None:
        env["PORT"] = str(port)
    env.update(read_env_file(home.env_file(instance)))
    return env
