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


def _remove_build(app_dir: Path, digest: str) -> None:
    # mkdtemp reserves a unique name; the build is renamed over the empty directory
    parked = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}gc-{digest[:12]}-", dir=app_dir))
    os.rename(app_dir / digest, parked)
    fsync_dir(app_dir)
    remove_tree(parked)
