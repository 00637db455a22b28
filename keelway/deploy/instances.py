"""What an instance is on disk before anything of it runs (`lay_down`: its data dir,
empty databases and env file with minted keys), and the release target it runs
(`Target`). Starting a generation lives in keelway/deploy/generation_start.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from keelway import failpoints
from keelway.builds.manifest import Manifest, Mode, load_manifest
from keelway.data.instance_db import lay_down_db
from keelway.deploy.steps import Done, Steps
from keelway.home import Home
from keelway.journal import StepKind
from keelway.runtime.environment import ensure_instance_key
from keelway.store import Store

failpoints.declare("laydown.one.before", "laydown.one.after")

@dataclass(frozen=True)
class Target:
    """What to run: one release of an app, resolved to its build and manifest."""

    app: str
    release: int
    build_digest: str
    build_path: Path
    config: dict[str, str]
    manifest: Manifest

    @classmethod
    def load(cls, app: str, release: int, build_digest: str, build_path: Path,
             config: dict[str, str], mode: Mode | None = None) -> Target:
        manifest = load_manifest(build_path)
        if mode is not None:
            # `deploy --mode`: this release swaps every service in the given mode.
            manifest = dataclasses.replace(manifest, services={
                name: dataclasses.replace(spec, mode=mode)
                for name, spec in manifest.services.items()})
        return cls(app, release, build_digest, build_path, config, manifest)


@dataclass(frozen=True)
class LaidDown:
    """What `lay_down` made of an instance's files (False: it was there already)."""

    database: bool
    key: bool


def lay_down(home: Home, instance: str) -> LaidDown:
    """An instance's files, whole, before anything of its app runs: its data dir (0700),
    an empty WAL database at KEELWAY_DB and its env file with a minted key.

    The one rule for every path that makes an instance (`deploy --host`, the implicit
    APP.localhost, `up --demo`, `instances add`): an app that opens KEELWAY_DB without
    creating it must find it there on its first start (issue 17). Each file is made only
    if missing, so a repeat after a crash anywhere ends the same and an instance's own
    database and key are never touched. Made as root where keelway runs as root; the
    spawn hands them to the instance's uid (keelway/runtime/identities.py)."""
    home.data_dir(instance).mkdir(mode=0o700, parents=True, exist_ok=True)
    database = lay_down_db(home.db_path(instance))
    key = ensure_instance_key(home.env_file(instance))
    return LaidDown(database, key)


async def lay_down_step(store: Store, home: Home, op_id: int, instance: str) -> None:
    """`lay_down` as an attempt's first step, journaled so a crash inside is seen; the
    next attempt or wake lays down again (a no-op for what is there)."""
    async def step() -> Done:
        made = lay_down(home, instance)
        parts = [name for name, new in (("database", made.database), ("key", made.key))
                 if new]
        return Done("made " + " and ".join(parts) if parts else "all there")

    await Steps(store, op_id).run(StepKind.LAY_DOWN, step, before=("laydown.one.before",),
                                  after=("laydown.one.after",))
