"""Resolving records to what can run: builds on disk, the target a generation or an
instance runs, the last good build, and the instance's `current` link.

Lookups only, apart from the `current` link, which is derived from ACTIVE and rewritten
whole (a crash leaves it stale, never torn; boot rewrites it), and `stop_effect`, the one
step effect that stops a generation with its own grace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from keelway import names
from keelway.builds.manifest import DEFAULT_STOP_GRACE_S, Manifest, Mode, load_manifest
from keelway.deploy.errors import NotFoundError, UserError, checked
from keelway.deploy.steps import Done, Effect, Failed
from keelway.durable import symlink_atomic
from keelway.home import Home
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.records import Generation, Instance


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
        return cls.of(app, release, build_digest, build_path, config,
                      load_manifest(build_path), mode)

    @classmethod
    def of(cls, app: str, release: int, build_digest: str, build_path: Path,
           config: dict[str, str], manifest: Manifest, mode: Mode | None = None) -> Target:
        """A target whose manifest is read already (a dry-run deploy's, of a build not
        staged yet)."""
        if mode is not None:
            # `deploy --mode`: this release swaps every service in the given mode.
            manifest = dataclasses.replace(manifest, services={
                name: dataclasses.replace(spec, mode=mode)
                for name, spec in manifest.services.items()})
        return cls(app, release, build_digest, build_path, config, manifest)


def instance_named(store: Store, host: str) -> Instance:
    """The instance named `host`, its name checked first: the one lookup every
    operation on one instance starts from (UserError for a bad name, NotFoundError)."""
    checked(names.HOST, host)
    inst = store.instances.get_instance(host)
    if inst is None:
        raise NotFoundError(f"no instance {host}", hint="see `keelway status`")
    return inst


def instances_of(store: Store, app: str, host: str | None) -> list[Instance]:
    """`app`'s instances, or only `host` of them (NotFoundError for no such app, or no
    such instance of it): what an operation on an app, or one of its instances, acts on."""
    if store.apps.get_app(app) is None:
        raise NotFoundError(f"no app named {app}", hint="see `keelway apps`")
    instances = store.instances.list_instances(app)
    if host is not None:
        instances = [i for i in instances if i.host == host]
        if not instances:
            raise NotFoundError(f"{app} has no instance {host}",
                                hint=f"see `keelway status {app}`")
    return instances


def link_current(store: Store, home: Home, host: str) -> None:
    """Point the instance's `current` link at the build its ACTIVE web (or any) runs.

    Derived from ACTIVE, so a crash that leaves it stale is repaired at boot.
    """
    actives = sorted(store.generations.list_active(host), key=lambda a: a.service != "web")
    gen = store.generations.get_generation(actives[0].generation_id) if actives else None
    path = build_path(store, gen.app, gen.build_digest) if gen else None
    if path is not None:
        _point(home.current_link(host), path)


def link_every_current(store: Store, home: Home) -> None:
    """`link_current` for every instance, from two bulk reads: boot repairs the links
    of 10,000 instances without a query or an fsync for each one already right."""
    builds = {(b.app, b.digest): Path(b.path) for b in store.builds.list_builds()}
    linked: set[str] = set()
    for gen in store.generations.active_generations():  # web first within each instance
        if gen.instance in linked:
            continue
        linked.add(gen.instance)
        path = builds.get((gen.app, gen.build_digest))
        if path is not None and path.is_dir():
            _point(home.current_link(gen.instance), path)


def _point(link: Path, path: Path) -> None:
    # A link already right is left alone: rewriting it costs a rename and an fsync.
    with contextlib.suppress(OSError):
        if os.readlink(link) == str(path):
            return
    symlink_atomic(link, path)


def build_path(store: Store, app: str, digest: str) -> Path | None:
    build = next((b for b in store.builds.list_builds(app) if b.digest == digest), None)
    return Path(build.path) if build is not None and Path(build.path).is_dir() else None

def target_of(store: Store, gen: Generation) -> Target | None:
    path = build_path(store, gen.app, gen.build_digest)
    if path is None:
        return None
    release = store.builds.get_release(gen.app, gen.release)
    app = store.apps.get_app(gen.app)
    config = release.config if release else (app.config if app else {})
    return Target.load(gen.app, gen.release, gen.build_digest, path, dict(config))

def stop_grace_s(store: Store, gen: Generation) -> float:
    """How long `gen` gets between SIGTERM and SIGKILL: its own service's stop_grace, in
    the manifest of the release it runs, wherever it is stopped (a retire, a hold, a
    reconcile, `down`). Not the grace of the release replacing it: how long a process
    needs to stop is a property of its own code. The default if its build is gone."""
    target = target_of(store, gen)
    spec = target.manifest.services.get(gen.service) if target else None
    return spec.stop_grace_s if spec else DEFAULT_STOP_GRACE_S


def stop_effect(store: Store, supervisor: Supervisor, gen: Generation) -> Effect:
    """A STOP step's effect: `gen`'s tree stopped with its own grace and proven gone."""
    async def stop() -> Done | Failed:
        if await supervisor.stop(gen, stop_grace_s(store, gen)):
            return Done(f"generation {gen.id} gone")
        pid = store.local.presence(gen.id).pid
        return Failed(f"{gen.service} generation {gen.id} (pid {pid}) did not stop")

    return stop


def running_target(store: Store, host: str) -> Target | None:
    actives = sorted(store.generations.list_active(host), key=lambda a: a.service != "web")
    for active in actives:
        gen = store.generations.get_generation(active.generation_id)
        if gen is not None:
            return target_of(store, gen)
    return None

def release_target(store: Store, app: str, number: int) -> Target | None:
    """Release `number` of `app` as a target, or None if it has no row or its build is
    no longer staged."""
    release = store.builds.get_release(app, number)
    path = build_path(store, app, release.build_digest) if release is not None else None
    if release is None or path is None:
        return None
    return Target.load(app, number, release.build_digest, path, dict(release.config))


def current_release(store: Store, app: str) -> Target:
    releases = store.builds.list_releases(app)
    for release in releases:
        path = build_path(store, app, release.build_digest)
        if path is not None:
            return Target.load(app, release.number, release.build_digest, path,
                               dict(release.config))
    raise UserError(f"{app} has no release yet", hint=f"deploy {app} first")

def last_good(store: Store, app: str, except_digest: str) -> Target | None:
    good = {b.digest for b in store.builds.list_builds(app) if b.good}
    for release in store.builds.list_releases(app):
        if release.build_digest in good and release.build_digest != except_digest:
            path = build_path(store, app, release.build_digest)
            if path is not None:
                return Target.load(app, release.number, release.build_digest, path,
                                   dict(release.config))
    return None
