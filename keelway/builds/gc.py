"""Garbage collection of staged builds: remove every build nothing pins.

Owns: removal of `builds/<app>/<digest>/` directories. It never decides what is in
use: the control plane computes `pinned` from its store (releases, ACTIVE entries,
in-flight attempts) and passes it in; anything not named there is removed.

Invariants and crash windows:
- A digest directory exists only complete. Removal first renames it to a `.tmp-`
  name in the same directory and flushes that directory, then deletes the tree: a
  crash mid-delete leaves a `.tmp-` leftover that `stage.sweep` removes at boot,
  never a half-deleted build under its digest name.
- `.tmp-` entries are never collected here: they may be stagings in progress.
- Only names that look like digests are touched; anything else in builds_dir is left
  alone (and reported by nobody here: gc removes, it does not judge).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from keelway.builds.cache import DepsCache, unshared_bytes
from keelway.builds.errors import BuildError
from keelway.builds.manifest import DEFAULT_KEEP_RELEASES, load_manifest
from keelway.builds.stage import DIGEST_RE
from keelway.builds.tree import remove_tree
from keelway.durable import TEMP_PREFIX, fsync_dir


def staged_builds(builds_dir: Path) -> list[tuple[str, str]]:
    """Every (app, digest) staged under `builds_dir`, sorted."""
    found: list[tuple[str, str]] = []
    builds_dir = Path(builds_dir)
    if not builds_dir.is_dir():
        return found
    for app_dir in builds_dir.iterdir():
        if app_dir.name.startswith(TEMP_PREFIX) or app_dir.is_symlink() or not app_dir.is_dir():
            continue
        for entry in app_dir.iterdir():
            if DIGEST_RE.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
                found.append((app_dir.name, entry.name))
    return sorted(found)


def collect(
    builds_dir: Path, pinned: set[tuple[str, str]], *, dry_run: bool = False
) -> list[tuple[str, str]]:
    """Remove every staged (app, digest) not in `pinned`; return them, sorted.

    With `dry_run`, remove nothing and return what would be removed. The caller must
    hold whatever lock keeps a new pin from appearing between computing `pinned` and
    this call (a build staged and named after the listing is not seen here anyway).
    """
    doomed = [build for build in staged_builds(builds_dir) if build not in pinned]
    if dry_run:
        return doomed
    for app, digest in doomed:
        _remove_build(Path(builds_dir) / app, digest)
    return doomed


def freed_bytes(builds_dir: Path, builds: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """What removing each build frees: its files no other build or cache entry links."""
    return {(app, digest): unshared_bytes(Path(builds_dir) / app / digest)
            for app, digest in builds}


def releases_keep(build_paths: dict[str, Path | None]) -> dict[str, int]:
    """Each app's `[releases] keep`, from the keelway.toml of its newest release's build
    (the default when that build is gone or its manifest no longer reads)."""
    keep = {}
    for app, path in build_paths.items():
        try:
            keep[app] = (load_manifest(path).releases_keep if path is not None
                         else DEFAULT_KEEP_RELEASES)
        except (OSError, BuildError):
            keep[app] = DEFAULT_KEEP_RELEASES
    return keep


def collect_cache(cache: DepsCache | None, *, dry_run: bool = False) -> list[tuple[str, int]]:
    """Remove the dependency cache entries no staged build shares a file with; returns
    (key, bytes freed) of each. A later build of such a key installs it again."""
    if cache is None:
        return []
    found = []
    for entry in cache.unused():
        freed = unshared_bytes(entry) if dry_run else cache.remove(entry)
        found.append((entry.name, freed))
    return found


def _remove_build(app_dir: Path, digest: str) -> None:
    # mkdtemp reserves a unique name; the build is renamed over the empty directory
    parked = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}gc-{digest[:12]}-", dir=app_dir))
    os.rename(app_dir / digest, parked)
    fsync_dir(app_dir)
    remove_tree(parked)
